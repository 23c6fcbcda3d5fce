#!/usr/bin/env python3
"""Checks one rendering of helm/samsa (the output of tests/deploy/helm-render).

    helm-check.py CASE RENDERED.yaml NOTES.txt KUBE_VERSION

Every object is validated against the Kubernetes OpenAPI schemas of
KUBE_VERSION with kubernetes-validate in strict mode (unknown fields are
errors); the ServiceMonitor, a prometheus-operator CRD that those schemas
lack, against the pydantic models cloudcoil generates from the
prometheus-operator CRDs, with every field of the object required to be
one the model knows. Then the structure is checked: CASE (default,
replicas-5, broker-only, external-nodeport, external-loadbalancer, custom, secure) says what
the values were. Run by tests/deploy/helm.sh; exits 1 on the first
failed check with a message naming it.
"""

import hashlib
import pathlib
import re
import sys
import tomllib

import kubernetes_validate
import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
RELEASE, NAMESPACE = "samsa", "samsa-ns"
FULL, HEADLESS = "samsa", "samsa-headless"
DOMAIN = f"{HEADLESS}.{NAMESPACE}.svc.cluster.local"
SELECTOR = {
    "app.kubernetes.io/name": "samsa",
    "app.kubernetes.io/instance": RELEASE,
    "app.kubernetes.io/component": "broker",
}

checks = 0


def check(cond, what):
    global checks
    checks += 1
    if not cond:
        print(f"FAILED: {what}", file=sys.stderr)
        sys.exit(1)


def eq(actual, expected, what):
    check(actual == expected, f"{what}: expected {expected!r}, got {actual!r}")


def split_rendered(text):
    """(source, raw content, parsed object) of each document, as printed."""
    out = []
    parts = re.split(r"^---\n# Source: (.*)\n", text, flags=re.M)
    check(parts[0] == "", "output starts with a document separator")
    for i in range(1, len(parts), 2):
        source, content = parts[i], parts[i + 1]
        check(content.endswith("\n"), f"document of {source} ends with a newline")
        out.append((source, content[:-1], yaml.safe_load(content)))
    return out


def chart_meta():
    return yaml.safe_load((ROOT / "helm/samsa/Chart.yaml").read_text())


def samsa_keys():
    """Field names of BrokerConfig and LogConfig: the keys samsa accepts."""
    broker = (ROOT / "crates/samsa-broker/src/config.rs").read_text()
    body = broker[broker.index("pub struct BrokerConfig") :]
    body = body[: body.index("\n}\n")]
    keys = set(re.findall(r"^\s*pub (\w+):", body, flags=re.M))
    storage = (ROOT / "crates/samsa-storage/src/config.rs").read_text()
    body = storage[storage.index("pub struct LogConfig") :]
    body = body[: body.index("\n}\n")]
    log_keys = set(re.findall(r"^\s*pub (\w+):", body, flags=re.M))
    return keys, log_keys


def validate_objects(docs, kube_version):
    validated = {}
    for source, _, obj in docs:
        kind = obj["kind"]
        if kind == "ServiceMonitor":
            validate_service_monitor(obj)
            validated[kind] = validated.get(kind, 0) + 1
            continue
        try:
            kubernetes_validate.validate(obj, kube_version, strict=True)
        except kubernetes_validate.ValidationError as e:
            check(False, f"{source}: {kind} {obj['metadata']['name']} invalid for Kubernetes {kube_version}: {e.message} at {list(e.path)}")
        except kubernetes_validate.SchemaNotFoundError:
            check(False, f"{source}: no Kubernetes {kube_version} schema for {obj['apiVersion']} {kind}")
        validated[kind] = validated.get(kind, 0) + 1
    return validated


def unknown_fields(given, known, path="$"):
    """Paths in `given` that the model dump `known` lacks (pydantic drops
    fields it does not know instead of refusing them)."""
    if isinstance(given, dict):
        if not isinstance(known, dict):
            return [path]
        out = []
        for k, v in given.items():
            if k not in known:
                out.append(f"{path}.{k}")
            else:
                out += unknown_fields(v, known[k], f"{path}.{k}")
        return out
    if isinstance(given, list):
        if not isinstance(known, list) or len(known) != len(given):
            return [path]
        return [p for i, (g, k) in enumerate(zip(given, known)) for p in unknown_fields(g, k, f"{path}[{i}]")]
    return []


def validate_service_monitor(obj):
    from cloudcoil.models.prometheus_operator.v1 import ServiceMonitor

    try:
        model = ServiceMonitor.model_validate(obj)
    except Exception as e:  # pydantic.ValidationError
        check(False, f"ServiceMonitor does not fit the prometheus-operator model: {e}")
    dumped = model.model_dump(by_alias=True, exclude_unset=True, mode="json")
    unknown = unknown_fields(obj, dumped)
    check(not unknown, f"ServiceMonitor fields the prometheus-operator model does not know: {unknown}")
    check(obj["apiVersion"] == "monitoring.coreos.com/v1", "ServiceMonitor apiVersion monitoring.coreos.com/v1")


def by_kind(docs, kind):
    return [obj for _, _, obj in docs if obj["kind"] == kind]


def one(docs, kind, name=None):
    found = [o for o in by_kind(docs, kind) if name is None or o["metadata"]["name"] == name]
    eq(len(found), 1, f"number of {kind} objects named {name}")
    return found[0]


def check_common(docs, notes, n, meta, voters_n=None):
    voters_n = n if voters_n is None else voters_n
    chart_label = f"{meta['name']}-{meta['version']}"
    for source, _, obj in docs:
        md = obj["metadata"]
        where = f"{source} {obj['kind']} {md['name']}"
        eq(md.get("namespace"), NAMESPACE, f"{where}: namespace")
        labels = md.get("labels", {})
        for k, v in SELECTOR.items():
            eq(labels.get(k), v, f"{where}: label {k}")
        eq(labels.get("app.kubernetes.io/managed-by"), "Helm", f"{where}: label managed-by")
        eq(labels.get("helm.sh/chart"), chart_label, f"{where}: label helm.sh/chart")
        check(labels.get("app.kubernetes.io/version"), f"{where}: label app.kubernetes.io/version")

    sts = one(docs, "StatefulSet", FULL)
    spec = sts["spec"]
    eq(spec["replicas"], n, "StatefulSet replicas")
    eq(spec["podManagementPolicy"], "Parallel", "StatefulSet podManagementPolicy")
    eq(spec["serviceName"], HEADLESS, "StatefulSet serviceName")
    eq(spec["updateStrategy"], {"type": "RollingUpdate"}, "StatefulSet updateStrategy")
    eq(spec["selector"], {"matchLabels": SELECTOR}, "StatefulSet selector")
    pod = spec["template"]
    for k, v in SELECTOR.items():
        eq(pod["metadata"]["labels"].get(k), v, f"pod template label {k}")
    podspec = pod["spec"]
    eq(podspec["securityContext"].get("fsGroup"), 10001, "pod fsGroup")
    eq(podspec["securityContext"].get("runAsNonRoot"), True, "pod runAsNonRoot")
    eq(podspec["enableServiceLinks"], False, "enableServiceLinks")
    eq(len(podspec["containers"]), 1, "containers")
    c = podspec["containers"][0]
    eq(c["args"][:3], ["server", "--config", "/etc/samsa/samsa.toml"], "container args")
    eq(c["securityContext"].get("runAsNonRoot"), True, "container runAsNonRoot")
    eq(c["securityContext"].get("allowPrivilegeEscalation"), False, "container allowPrivilegeEscalation")
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    for name, port in {"kafka": 9092, "controller": 9093, "http": 9644}.items():
        eq(ports.get(name), port, f"container port {name}")
    eq(c["readinessProbe"]["httpGet"], {"path": "/readyz", "port": "http"}, "readiness probe")
    eq(c["livenessProbe"]["httpGet"], {"path": "/healthz", "port": "http"}, "liveness probe")
    eq(c["startupProbe"]["httpGet"], {"path": "/healthz", "port": "http"}, "startup probe")
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    eq(mounts.get("data"), "/var/lib/samsa", "data volume mount")
    eq(mounts.get("config"), "/etc/samsa", "config volume mount")
    vols = {v["name"]: v for v in podspec["volumes"]}
    eq(vols["config"]["configMap"]["name"], FULL, "config volume's ConfigMap")
    vct = spec["volumeClaimTemplates"]
    eq([t["metadata"]["name"] for t in vct], ["data"], "volumeClaimTemplates")
    eq(vct[0]["metadata"]["labels"], SELECTOR, "PVC template labels (immutable: selector labels only)")
    eq(spec["persistentVolumeClaimRetentionPolicy"], {"whenDeleted": "Retain", "whenScaled": "Retain"}, "PVC retention")

    # The config checksum is the sha256 of the rendered ConfigMap.
    cm_raw = [raw for src, raw, obj in docs if obj["kind"] == "ConfigMap"]
    eq(len(cm_raw), 1, "ConfigMaps")
    eq(pod["metadata"]["annotations"]["checksum/config"], hashlib.sha256(cm_raw[0].encode()).hexdigest(), "checksum/config = sha256 of the ConfigMap")

    cm = one(docs, "ConfigMap", FULL)
    conf = tomllib.loads(cm["data"]["samsa.toml"])
    eq(conf["node_id"], "from-hostname", "node_id")
    eq(conf["data_dir"], "/var/lib/samsa", "data_dir")
    eq(conf["listen"], "0.0.0.0:9092", "listen")
    eq(conf["controller_listen"], "0.0.0.0:9093", "controller_listen")
    eq(conf["http_listen"], "0.0.0.0:9644", "http_listen")
    eq(conf["advertised_listener"], f"{{hostname}}.{DOMAIN}:9092", "advertised_listener")
    voters = conf["controller_quorum_voters"].split(",")
    eq(len(voters), voters_n, "number of quorum voters")
    eq(voters, [f"{i + 1}@{FULL}-{i}.{DOMAIN}:9093" for i in range(voters_n)], "quorum voters")
    keys, log_keys = samsa_keys()
    for k in conf:
        if k == "listeners" and "listeners" not in keys:
            print("note: crates/samsa-broker/src/config.rs has no `listeners` key yet (named listeners are being added)")
            continue
        check(k in keys, f"samsa.toml key {k} is a BrokerConfig field")
    for k in conf.get("log", {}):
        check(k in log_keys, f"samsa.toml key log.{k} is a LogConfig field")

    hl = one(docs, "Service", HEADLESS)
    eq(hl["spec"]["clusterIP"], "None", "headless clusterIP")
    eq(hl["spec"]["publishNotReadyAddresses"], True, "headless publishNotReadyAddresses")
    eq(hl["spec"]["selector"], SELECTOR, "headless selector")
    eq({p["name"]: (p["port"], p["targetPort"]) for p in hl["spec"]["ports"]},
       {"kafka": (9092, "kafka"), "controller": (9093, "controller"), "http": (9644, "http")}, "headless ports")
    svc = one(docs, "Service", FULL)
    eq(svc["spec"]["selector"], SELECTOR, "client Service selector")
    eq([(p["name"], p["port"], p["targetPort"]) for p in svc["spec"]["ports"]], [("kafka", 9092, "kafka")], "client Service ports")
    check("publishNotReadyAddresses" not in svc["spec"], "client Service routes to ready pods only")

    pdb = one(docs, "PodDisruptionBudget", FULL)
    eq(pdb["spec"]["maxUnavailable"], 1, "PDB maxUnavailable")
    eq(pdb["spec"]["selector"], {"matchLabels": SELECTOR}, "PDB selector")

    sa = one(docs, "ServiceAccount")
    eq(podspec["serviceAccountName"], sa["metadata"]["name"], "pod's ServiceAccount")
    eq(sa["automountServiceAccountToken"], False, "no API token mounted")

    check(f"{n} node(s) in {NAMESPACE}" in notes, "NOTES names the node count")
    check(f"{FULL}.{NAMESPACE}.svc.cluster.local:9092" in notes, "NOTES names the bootstrap address")
    return sts, conf


def external_services(docs):
    return sorted((o for o in by_kind(docs, "Service") if o["metadata"]["name"].endswith("-external")),
                  key=lambda o: o["metadata"]["name"])


def check_external(docs, conf, sts, n, typ, addresses, node_ports):
    ext = external_services(docs)
    eq(len(ext), n, "number of external Services")
    for i, s in enumerate(ext):
        eq(s["metadata"]["name"], f"{FULL}-{i}-external", "external Service name")
        eq(s["spec"]["type"], typ, f"external Service {i} type")
        eq(s["spec"]["selector"], {**SELECTOR, "statefulset.kubernetes.io/pod-name": f"{FULL}-{i}"}, f"external Service {i} selector")
        eq(len(s["spec"]["ports"]), 1, f"external Service {i} ports")
        p = s["spec"]["ports"][0]
        eq((p["port"], p["targetPort"]), (9094, "external"), f"external Service {i} port")
        if node_ports:
            eq(p["nodePort"], node_ports[i], f"external Service {i} nodePort")
    c = sts["spec"]["template"]["spec"]["containers"][0]
    eq({p["name"]: p["containerPort"] for p in c["ports"]}.get("external"), 9094, "container port external")
    eq(conf["listeners"]["external"]["listen"], "0.0.0.0:9094", "external listener listen")
    eq(conf["listeners"]["external"]["advertised_listener"], addresses, "external listener advertised addresses (element n-1 for node n)")
    return ext


def main():
    case, rendered, notes_file, kube_version = sys.argv[1:5]
    text = pathlib.Path(rendered).read_text()
    notes = pathlib.Path(notes_file).read_text()
    docs = split_rendered(text)
    meta = chart_meta()
    validated = validate_objects(docs, kube_version)

    n = {"replicas-5": 5, "broker-only": 4}.get(case, 3)
    sts, conf = check_common(docs, notes, n, meta, voters_n=3 if case == "broker-only" else None)
    c = sts["spec"]["template"]["spec"]["containers"][0]
    vct = sts["spec"]["volumeClaimTemplates"][0]["spec"]

    if case in ("default", "replicas-5"):
        eq(external_services(docs), [], "no external Services")
        eq(by_kind(docs, "ServiceMonitor"), [], "no ServiceMonitor by default")
        check("storageClassName" not in vct, "default StorageClass (no storageClassName)")
        eq(vct["resources"]["requests"]["storage"], "20Gi", "volume size")
        eq(conf["default_replication_factor"], 3, "default_replication_factor = min(3, replicas)")
        check("listeners" not in conf, "no extra listener")
        check("process_roles" not in conf, "every pod a voter: no process_roles")
        for key in ("security_protocol", "ssl_cert_file", "authorizer_enable", "super_users", "sasl_enabled_mechanisms", "inter_node_tls_cert_file"):
            check(key not in conf, f"no security key by default ({key})")
        check(all(v["name"] != "tls" for v in sts["spec"]["template"]["spec"]["volumes"]), "no TLS volume by default")
        workspace = tomllib.loads((ROOT / "Cargo.toml").read_text())["workspace"]["package"]["version"]
        eq(meta["appVersion"], workspace, "Chart.yaml appVersion = the workspace version in Cargo.toml")
        eq(meta["apiVersion"], "v2", "Chart.yaml apiVersion")
        eq(sts["metadata"]["labels"]["app.kubernetes.io/version"], meta["appVersion"], "version label = appVersion")
        eq(c["image"], f"samsa:{meta['appVersion']}", "image defaults to the appVersion tag")
        aff = sts["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
        eq(aff["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]["labelSelector"],
           {"matchLabels": SELECTOR}, "soft pod anti-affinity")
        eq(sts["spec"]["template"]["spec"]["terminationGracePeriodSeconds"], 60, "terminationGracePeriodSeconds")
        check("lifecycle" not in c, "no preStop by default")
    elif case == "broker-only":
        eq(conf["process_roles"], "from-voters", "process_roles: pods past the voters are brokers only")
        eq(conf["inter_node_advertised_address"], f"{{hostname}}.{DOMAIN}:9093", "inter_node_advertised_address")
        eq(conf["default_replication_factor"], 3, "default_replication_factor = min(3, replicas)")
        check("Pods 0-2 are controller quorum voters and brokers, the other 1 brokers" in notes, "NOTES names the voters")
        check("fixed by controllers=3" in notes, "NOTES says how to scale")
    elif case == "external-nodeport":
        ports = [31090, 31091, 31092]
        check_external(docs, conf, sts, 3, "NodePort", [f"203.0.113.5:{p}" for p in ports], ports)
        check("203.0.113.5:31092   (broker 3" in notes, "NOTES lists the external addresses")
    elif case == "external-loadbalancer":
        ips = ["198.51.100.10", "198.51.100.11", "198.51.100.12"]
        ext = check_external(docs, conf, sts, 3, "LoadBalancer", [f"{ip}:9094" for ip in ips], None)
        for i, s in enumerate(ext):
            eq(s["spec"]["loadBalancerIP"], ips[i], f"external Service {i} loadBalancerIP")
            eq(s["spec"]["loadBalancerSourceRanges"], ["10.0.0.0/8"], f"external Service {i} source ranges")
            eq(s["spec"]["externalTrafficPolicy"], "Local", f"external Service {i} externalTrafficPolicy")
            eq(s["metadata"]["annotations"], {"service.beta.kubernetes.io/aws-load-balancer-type": "nlb"}, f"external Service {i} annotations")
    elif case == "custom":
        eq(vct["storageClassName"], "fast-ssd", "storageClassName")
        eq(vct["resources"]["requests"]["storage"], "100Gi", "volume size")
        eq(c["resources"], {"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"cpu": "4", "memory": "8Gi"}}, "resources")
        ps = sts["spec"]["template"]["spec"]
        check("podAntiAffinity" not in ps["affinity"] and "nodeAffinity" in ps["affinity"], "affinity replaces the anti-affinity preset")
        eq(ps["tolerations"], [{"key": "dedicated", "operator": "Equal", "value": "kafka", "effect": "NoSchedule"}], "tolerations")
        tsc = ps["topologySpreadConstraints"]
        eq(len(tsc), 1, "topology spread constraints")
        eq(tsc[0]["labelSelector"], {"matchLabels": SELECTOR}, "topology spread constraint gets the selector labels")
        eq(tsc[0]["topologyKey"], "topology.kubernetes.io/zone", "topology spread key")
        eq(ps["nodeSelector"], {"kubernetes.io/os": "linux"}, "nodeSelector")
        eq(ps["priorityClassName"], "kafka-critical", "priorityClassName")
        eq(ps["imagePullSecrets"], [{"name": "regcred"}], "imagePullSecrets")
        eq(ps["serviceAccountName"], "samsa-sa", "serviceAccountName")
        eq(ps["terminationGracePeriodSeconds"], 90, "terminationGracePeriodSeconds")
        eq(c["lifecycle"], {"preStop": {"exec": {"command": ["sleep", "5"]}}}, "preStop")
        eq(c["image"], "registry.example.com/samsa:0.1.0-rc1", "image")
        eq(c["imagePullPolicy"], "Always", "imagePullPolicy")
        eq(c["env"], [{"name": "RUST_LOG", "value": "info"}], "extra env")
        eq(c["args"][3:], ["--set", "auto_create_topics_enable=false"], "extra args")
        pm = sts["spec"]["template"]["metadata"]
        eq(pm["annotations"].get("example.com/owner"), "streaming", "pod annotation")
        eq(pm["labels"].get("team"), "streaming", "pod label")
        for _, _, obj in docs:
            eq(obj["metadata"]["labels"].get("env"), "test", f"{obj['kind']} common label")
            eq(obj["metadata"].get("annotations", {}).get("example.com/contact"), "streaming@example.com", f"{obj['kind']} common annotation")
        # config: integers stay integers, nested and dotted keys merge, null removes.
        eq(conf["num_partitions"], 6, "config num_partitions (an integer, not 6.0)")
        eq(conf["log"], {"segment_bytes": 268435456, "retention_ms": 86400000, "flush": {"interval": {"interval_ms": 1000}}}, "config log table")
        check("default_replication_factor" not in conf, "config null removes default_replication_factor")
        sm = one(docs, "ServiceMonitor", FULL)
        eq(sm["metadata"]["labels"].get("release"), "prometheus", "ServiceMonitor label")
        eq(sm["spec"]["selector"], {"matchLabels": SELECTOR}, "ServiceMonitor selector")
        eq(sm["spec"]["namespaceSelector"], {"matchNames": [NAMESPACE]}, "ServiceMonitor namespace")
        ep = sm["spec"]["endpoints"]
        eq([(e["port"], e["path"], e["interval"], e["scrapeTimeout"]) for e in ep], [("http", "/metrics", "15s", "10s")], "ServiceMonitor endpoint")
        # Only the headless Service has the port the ServiceMonitor scrapes.
        with_http = [s["metadata"]["name"] for s in by_kind(docs, "Service") if any(p["name"] == "http" for p in s["spec"]["ports"])]
        eq(with_http, [HEADLESS], "Services with the http port")
    elif case == "secure":
        ports = [31090, 31091, 31092]
        check_external(docs, conf, sts, 3, "NodePort", [f"203.0.113.5:{p}" for p in ports], ports)
        eq(conf["security_protocol"], "SASL_SSL", "in-cluster listener SASL_SSL")
        eq(conf["listeners"]["external"]["security_protocol"], "SASL_SSL", "external listener SASL_SSL")
        eq(conf["listeners"]["admin"], {"listen": "127.0.0.1:9095"}, "pod-local admin listener (PLAINTEXT)")
        tls = {k: conf[k] for k in ("ssl_cert_file", "ssl_key_file", "ssl_ca_file")}
        eq(tls, {"ssl_cert_file": "/etc/samsa-tls/tls.crt", "ssl_key_file": "/etc/samsa-tls/tls.key",
                 "ssl_ca_file": "/etc/samsa-tls/ca.crt"}, "TLS files from the mounted Secret")
        eq(conf["ssl_client_auth"], "requested", "ssl_client_auth")
        eq([conf[f"inter_node_tls_{k}_file"] for k in ("cert", "key", "ca")], list(tls.values()), "mutual TLS between pods with the same files")
        eq(conf["sasl_enabled_mechanisms"], ["SCRAM-SHA-512"], "SASL mechanisms")
        eq(conf["authorizer_enable"], True, "authorizer on")
        eq(conf["super_users"], ["User:admin", "User:ANONYMOUS"], "super users: the configured ones and the admin listener's")
        check("allow_everyone_if_no_acl_found" not in conf, "allow_everyone_if_no_acl_found left at its default")
        mounts = {m["name"]: m for m in c["volumeMounts"]}
        eq((mounts["tls"]["mountPath"], mounts["tls"].get("readOnly")), ("/etc/samsa-tls", True), "TLS Secret mounted read-only")
        vols = {v["name"]: v for v in sts["spec"]["template"]["spec"]["volumes"]}
        eq(vols["tls"]["secret"]["secretName"], "samsa-tls", "TLS volume from security.tlsSecret")
        eq(conf["scram_users_dir"], "/etc/samsa-users", "declared users from the mounted Secret")
        eq((mounts["users"]["mountPath"], mounts["users"].get("readOnly")), ("/etc/samsa-users", True), "users Secret mounted read-only")
        eq(vols["users"]["secret"]["secretName"], "samsa-users", "users volume from security.usersSecret")
        eq(conf["acls"], [
            {"principal": "User:app", "resource_type": "TOPIC", "resource_name": "orders-", "pattern_type": "PREFIXED", "operation": "WRITE"},
            {"principal": "User:app", "resource_type": "CLUSTER", "operation": "IDEMPOTENT_WRITE"},
            {"principal": "User:*", "resource_type": "TOPIC", "resource_name": "secret", "operation": "ALL", "permission": "DENY", "host": "*"},
        ], "declared ACLs as samsa's [[acls]] (inline tables)")
    else:
        check(False, f"unknown case {case}")

    kinds = ", ".join(f"{v} {k}" for k, v in sorted(validated.items()))
    print(f"{case}: {len(docs)} objects valid ({kinds}), {checks} checks passed")


if __name__ == "__main__":
    main()
