"""A throwaway PKI for the TLS tests: a CA, a server certificate for
127.0.0.1/localhost, client certificates (valid, expired, signed by another
CA), written as PEM files into a directory. Made with `cryptography`
(tests/compat/requirements.txt), so any validity period can be set.
"""

import datetime
import pathlib

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

NOW = datetime.datetime.now(datetime.timezone.utc)


def _name(**attrs):
    oids = {"CN": NameOID.COMMON_NAME, "OU": NameOID.ORGANIZATIONAL_UNIT_NAME, "O": NameOID.ORGANIZATION_NAME}
    # Encoded O, OU, CN: RFC 2253 (Kafka's principal form) lists them CN first.
    order = ["O", "OU", "CN"]
    return x509.Name([x509.NameAttribute(oids[k], attrs[k]) for k in order if k in attrs])


def _key():
    return ec.generate_private_key(ec.SECP256R1())


def _write(directory, stem, cert, key):
    directory = pathlib.Path(directory)
    (directory / f"{stem}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (directory / f"{stem}.key").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return directory / f"{stem}.pem", directory / f"{stem}.key"


class Ca:
    def __init__(self, common_name):
        self.key = _key()
        self.name = _name(CN=common_name)
        self.cert = (x509.CertificateBuilder()
                     .subject_name(self.name).issuer_name(self.name)
                     .public_key(self.key.public_key())
                     .serial_number(x509.random_serial_number())
                     .not_valid_before(NOW - datetime.timedelta(days=1))
                     .not_valid_after(NOW + datetime.timedelta(days=30))
                     .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                     .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                                  content_commitment=False, key_encipherment=False,
                                                  data_encipherment=False, key_agreement=False,
                                                  encipher_only=False, decipher_only=False), critical=True)
                     .sign(self.key, hashes.SHA256()))

    def issue(self, subject, server=False, not_before=None, not_after=None):
        key = _key()
        builder = (x509.CertificateBuilder()
                   .subject_name(subject).issuer_name(self.name)
                   .public_key(key.public_key())
                   .serial_number(x509.random_serial_number())
                   .not_valid_before(not_before or NOW - datetime.timedelta(days=1))
                   .not_valid_after(not_after or NOW + datetime.timedelta(days=30))
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                   .add_extension(x509.ExtendedKeyUsage(
                       [ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]),
                       critical=False))
        if server:
            import ipaddress
            builder = builder.add_extension(x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        return builder.sign(self.key, hashes.SHA256()), key


def make_pki(directory):
    """Writes ca.pem, server.pem/.key, alice.pem/.key (subject
    CN=alice,OU=eng,O=samsa), expired.pem/.key, stranger.pem/.key (signed by
    another CA); returns their paths by stem."""
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    ca, other = Ca("samsa test CA"), Ca("someone else's CA")
    (directory / "ca.pem").write_bytes(ca.cert.public_bytes(serialization.Encoding.PEM))
    paths = {"ca": directory / "ca.pem"}
    for stem, cert_key in {
        "server": ca.issue(_name(CN="localhost"), server=True),
        "alice": ca.issue(_name(CN="alice", OU="eng", O="samsa")),
        "expired": ca.issue(_name(CN="late"), not_before=NOW - datetime.timedelta(days=10),
                            not_after=NOW - datetime.timedelta(days=1)),
        "stranger": other.issue(_name(CN="stranger")),
    }.items():
        paths[stem] = _write(directory, stem, *cert_key)
    return paths


def server_settings(paths, client_auth="none"):
    """The broker settings of a TLS listener with this PKI."""
    cert, key = paths["server"]
    return [f"ssl_cert_file={cert}", f"ssl_key_file={key}", f"ssl_ca_file={paths['ca']}",
            f"ssl_client_auth={client_auth}"]
