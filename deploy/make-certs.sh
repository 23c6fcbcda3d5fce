#!/usr/bin/env bash
# A throwaway CA and one node certificate for deploy/compose.sasl-ssl.yaml:
#
#   deploy/make-certs.sh DIR     writes DIR/ca.pem, DIR/node.pem, DIR/node.key
#
# The certificate names samsa-0, samsa-1, samsa-2 (the containers), localhost
# and 127.0.0.1 (clients on the host) and serves as server and client
# certificate (mutual TLS between the nodes). Files are made readable by
# the image's user (uid 10001): for local clusters only; real deployments
# bring their own PKI. Needs openssl.
set -euo pipefail
dir=${1:?usage: deploy/make-certs.sh DIR}
mkdir -p "$dir"
cd "$dir"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 3650 \
    -subj "/CN=samsa compose CA" -keyout ca.key -out ca.pem 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
    -subj "/CN=samsa node" -keyout node.key -out node.csr 2>/dev/null
printf 'subjectAltName=DNS:samsa-0,DNS:samsa-1,DNS:samsa-2,DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\n' > node.ext
openssl x509 -req -in node.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 3650 \
    -extfile node.ext -out node.pem 2>/dev/null
rm -f node.csr node.ext ca.srl
chmod 755 .
chmod 644 ca.pem node.pem node.key
chmod 600 ca.key
echo "certificates in $(pwd): ca.pem, node.pem, node.key"
