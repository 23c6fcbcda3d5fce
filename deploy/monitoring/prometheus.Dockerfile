# Prometheus from Debian's `prometheus` package (2.42 in bookworm) on the
# offline base image of deploy/build-image.sh (samsa-base:bookworm, made
# from Debian packages): no container registry involved, only a Debian
# mirror for the package. The compose file's `monitoring` profile builds it
# (deploy/compose.yaml, deploy/monitoring/README.md); the configuration is
# mounted at /etc/prometheus.
#
#   deploy/build-image.sh --base-only      # samsa-base:bookworm, once
#   docker build --build-arg BASE=samsa-base:bookworm \
#       -f deploy/monitoring/prometheus.Dockerfile -t samsa-prometheus deploy/monitoring
ARG BASE=samsa-base:bookworm
FROM ${BASE}

# policy-rc.d keeps the package's maintainer scripts from starting the
# service during the build. Package lists and caches, documentation and the
# 200 MB of per-zone files of moment-timezone (a dependency of the web UI,
# which loads only its bundled file) are of no use in the image.
RUN printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d \
 && chmod +x /usr/sbin/policy-rc.d \
 && apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends prometheus \
 && rm -f /usr/sbin/policy-rc.d \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/cache/apt/archives/*.deb \
        /usr/share/doc/* /usr/share/man/* /usr/share/javascript/moment-timezone/data \
 && install -d -o prometheus -g prometheus /var/lib/prometheus/metrics2

# The package's user. The time series database stays in the container
# (no VOLUME: an anonymous volume would outlive `docker compose down`).
USER prometheus:prometheus
WORKDIR /var/lib/prometheus
EXPOSE 9090

ENTRYPOINT ["/usr/bin/prometheus"]
CMD ["--config.file=/etc/prometheus/prometheus.yml", \
     "--storage.tsdb.path=/var/lib/prometheus/metrics2", \
     "--web.listen-address=:9090"]
