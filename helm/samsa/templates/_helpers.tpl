{{/* Names, labels and the generated samsa configuration. */}}

{{- define "samsa.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
Full name: <release>-<chart>, or the release name when it contains the
chart name. It names the StatefulSet, so pods are <fullname>-<ordinal> —
samsa derives its node id from that suffix. At most 52 characters (the
StatefulSet's controller-revision-hash label adds 11).
*/}}
{{- define "samsa.fullname" -}}
{{- $name := "" -}}
{{- if .Values.fullnameOverride -}}
{{- $name = .Values.fullnameOverride -}}
{{- else -}}
{{- $base := default .Chart.Name .Values.nameOverride -}}
{{- if contains $base .Release.Name -}}
{{- $name = .Release.Name -}}
{{- else -}}
{{- $name = printf "%s-%s" .Release.Name $base -}}
{{- end -}}
{{- end -}}
{{- $name = trimSuffix "-" $name -}}
{{- if gt (len $name) 52 -}}
{{- fail (printf "the full name %q is longer than 52 characters: set fullnameOverride or a shorter release name" $name) -}}
{{- end -}}
{{- $name -}}
{{- end -}}

{{- define "samsa.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "samsa.headlessName" -}}
{{- printf "%s-headless" (include "samsa.fullname" .) -}}
{{- end -}}

{{/* Selector labels: immutable parts of the StatefulSet, also in PVC templates. */}}
{{- define "samsa.selectorLabels" -}}
app.kubernetes.io/name: {{ include "samsa.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: broker
{{- end -}}

{{- define "samsa.labels" -}}
helm.sh/chart: {{ include "samsa.chart" . }}
{{ include "samsa.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* metadata.annotations of every object, with the object's own (a map) merged in. */}}
{{- define "samsa.annotations" -}}
{{- $all := merge (deepCopy (.own | default dict)) (deepCopy .root.Values.commonAnnotations) -}}
{{- with $all }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{- define "samsa.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "samsa.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "samsa.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}
{{- end -}}

{{/* The replica count, checked: an integer >= 1, at least the voters. */}}
{{- define "samsa.replicas" -}}
{{- $n := int .Values.replicas -}}
{{- if lt $n 1 -}}
{{- fail (printf "replicas must be at least 1 (got %v)" .Values.replicas) -}}
{{- end -}}
{{- $_ := include "samsa.controllers" . -}}
{{- $n -}}
{{- end -}}

{{/* The voter count (controllers, else replicas), checked: odd unless
allowed, and no more than replicas. */}}
{{- define "samsa.controllers" -}}
{{- $key := "replicas" -}}
{{- $n := int .Values.replicas -}}
{{- if not (kindIs "invalid" .Values.controllers) -}}
{{- $key = "controllers" -}}
{{- $n = int .Values.controllers -}}
{{- if gt $n (int .Values.replicas) -}}
{{- fail (printf "controllers is %d but replicas is %d: the voters are pods 0 to controllers-1, so replicas must be at least controllers" $n (int .Values.replicas)) -}}
{{- end -}}
{{- end -}}
{{- if and (eq (mod $n 2) 0) (not .Values.allowEvenReplicas) -}}
{{- fail (printf "%s is %d: a controller quorum of %d nodes tolerates no more failures than one of %d; use an odd count or set allowEvenReplicas=true" $key $n $n (sub $n 1)) -}}
{{- end -}}
{{- $n -}}
{{- end -}}

{{/* DNS name of pod $i: <fullname>-<i>.<headless>.<namespace>.svc.<domain> */}}
{{- define "samsa.podDomain" -}}
{{- printf "%s.%s.svc.%s" (include "samsa.headlessName" .) .Release.Namespace .Values.clusterDomain -}}
{{- end -}}

{{- define "samsa.quorumVoters" -}}
{{- $fullname := include "samsa.fullname" . -}}
{{- $domain := include "samsa.podDomain" . -}}
{{- $voters := list -}}
{{- range $i := until (int (include "samsa.controllers" .)) -}}
{{- $voters = append $voters (printf "%d@%s-%d.%s:%d" (add1 $i) $fullname $i $domain (int $.Values.containerPorts.controller)) -}}
{{- end -}}
{{- join "," $voters -}}
{{- end -}}

{{/*
External advertised addresses, one per broker in ordinal order, as a JSON
list (include returns a string). Fails when they cannot be known.
*/}}
{{- define "samsa.externalAddresses" -}}
{{- $ea := .Values.externalAccess -}}
{{- $n := int (include "samsa.replicas" .) -}}
{{- $addrs := list -}}
{{- if $ea.advertisedAddresses -}}
{{- $addrs = $ea.advertisedAddresses -}}
{{- else if eq $ea.type "NodePort" -}}
{{- if not $ea.host -}}
{{- fail "externalAccess.enabled with type NodePort needs externalAccess.host (the address clients reach the nodes on) or externalAccess.advertisedAddresses" -}}
{{- end -}}
{{- range $p := $ea.nodePorts -}}
{{- $addrs = append $addrs (printf "%s:%d" $ea.host (int $p)) -}}
{{- end -}}
{{- else -}}
{{- range $ip := $ea.loadBalancerIPs -}}
{{- $addrs = append $addrs (printf "%s:%d" $ip (int $ea.servicePort)) -}}
{{- end -}}
{{- end -}}
{{- if ne (len $addrs) $n -}}
{{- fail (printf "externalAccess.enabled needs one advertised address per broker: %d replicas but %d addresses (set externalAccess.advertisedAddresses, or host and nodePorts for NodePort, or loadBalancerIPs for LoadBalancer)" $n (len $addrs)) -}}
{{- end -}}
{{- if and (eq $ea.type "NodePort") (ne (len $ea.nodePorts) $n) -}}
{{- fail (printf "externalAccess.type NodePort needs one entry in externalAccess.nodePorts per broker: %d replicas, %d node ports" $n (len $ea.nodePorts)) -}}
{{- end -}}
{{- toJson $addrs -}}
{{- end -}}

{{/* Flatten nested maps into dotted keys: dict "prefix" "" "map" $m "out" $out */}}
{{- define "samsa.flatten" -}}
{{- range $k, $v := .map -}}
{{- $key := ternary $k (printf "%s.%s" $.prefix $k) (eq $.prefix "") -}}
{{- if kindIs "map" $v -}}
{{- include "samsa.flatten" (dict "prefix" $key "map" $v "out" $.out) -}}
{{- else -}}
{{- $_ := set $.out $key $v -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
One value as TOML. Helm reads every YAML number as a float64, so whole
numbers are printed as integers (samsa's integer keys refuse 3.0).
*/}}
{{- define "samsa.tomlValue" -}}
{{- $v := .v -}}
{{- if kindIs "string" $v -}}
{{- toJson $v -}}
{{- else if kindIs "bool" $v -}}
{{- ternary "true" "false" $v -}}
{{- else if or (kindIs "float64" $v) (kindIs "float32" $v) -}}
{{- if eq (float64 $v) (float64 (int64 $v)) -}}{{ int64 $v }}{{- else -}}{{ $v }}{{- end -}}
{{- else if or (kindIs "int" $v) (kindIs "int64" $v) -}}
{{- $v -}}
{{- else if kindIs "slice" $v -}}
{{- $items := list -}}
{{- range $e := $v -}}
{{- if kindIs "slice" $e -}}
{{- fail (printf "config key %s: lists of lists are not supported" $.key) -}}
{{- else if kindIs "map" $e -}}
{{- /* a table in a list: a TOML inline table of plain values */ -}}
{{- $fields := list -}}
{{- range $fk := keys $e | sortAlpha -}}
{{- $fv := get $e $fk -}}
{{- if or (kindIs "map" $fv) (kindIs "slice" $fv) -}}
{{- fail (printf "config key %s: a table in a list holds plain values only (%s)" $.key $fk) -}}
{{- end -}}
{{- $fields = append $fields (printf "%s = %s" $fk (include "samsa.tomlValue" (dict "v" $fv "key" $.key))) -}}
{{- end -}}
{{- $items = append $items (printf "{ %s }" (join ", " $fields)) -}}
{{- else -}}
{{- $items = append $items (include "samsa.tomlValue" (dict "v" $e "key" $.key)) -}}
{{- end -}}
{{- end -}}
[{{ join ", " $items }}]
{{- else -}}
{{- fail (printf "config key %s: unsupported value %v (%s)" .key $v (kindOf $v)) -}}
{{- end -}}
{{- end -}}

{{/* The generated samsa.toml: the chart's keys, then .Values.config over them. */}}
{{- define "samsa.configToml" -}}
{{- $n := int (include "samsa.replicas" .) -}}
{{- $p := .Values.containerPorts -}}
{{- $gen := dict
    "node_id" "from-hostname"
    "data_dir" "/var/lib/samsa"
    "listen" (printf "0.0.0.0:%d" (int $p.kafka))
    "advertised_listener" (printf "{hostname}.%s:%d" (include "samsa.podDomain" .) (int $p.kafka))
    "controller_listen" (printf "0.0.0.0:%d" (int $p.controller))
    "http_listen" (printf "0.0.0.0:%d" (int $p.http))
    "controller_quorum_voters" (include "samsa.quorumVoters" .)
    "default_replication_factor" (min 3 $n)
-}}
{{- if not (kindIs "invalid" .Values.controllers) -}}
{{- /* pods past the voters are broker-only nodes, reached at their pod
names; generated whenever controllers is set, so that scaling replicas
leaves the ConfigMap (and the running pods) alone */ -}}
{{- $_ := set $gen "process_roles" "from-voters" -}}
{{- $_ := set $gen "inter_node_advertised_address" (printf "{hostname}.%s:%d" (include "samsa.podDomain" .) (int $p.controller)) -}}
{{- end -}}
{{- if .Values.externalAccess.enabled -}}
{{- $name := .Values.externalAccess.listenerName -}}
{{- $_ := set $gen (printf "listeners.%s.listen" $name) (printf "0.0.0.0:%d" (int .Values.externalAccess.containerPort)) -}}
{{- $_ := set $gen (printf "listeners.%s.advertised_listener" $name) (fromJsonArray (include "samsa.externalAddresses" .)) -}}
{{- end -}}
{{- include "samsa.securityConfig" (dict "root" . "gen" $gen) -}}
{{- $user := dict -}}
{{- include "samsa.flatten" (dict "prefix" "" "map" .Values.config "out" $user) -}}
{{- /* not sprig's merge: it would let a generated key fill a user's null */ -}}
{{- $all := deepCopy $gen -}}
{{- range $k, $v := $user -}}
{{- $_ := set $all $k $v -}}
{{- end -}}
{{- range $k := keys $all | sortAlpha -}}
{{- $v := get $all $k -}}
{{- if not (kindIs "invalid" $v) }}
{{ $k }} = {{ include "samsa.tomlValue" (dict "v" $v "key" $k) }}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
The generated keys of .Values.security (docs/SECURITY.md) into .gen: the
listeners' security protocols, the TLS files of tlsSecret (mounted at
/etc/samsa-tls by the StatefulSet), mutual TLS between pods, the pod-local
admin listener, the authorizer, the users of usersSecret (mounted at
/etc/samsa-users) and the declared ACLs. Refuses combinations that cannot
work.
*/}}
{{- define "samsa.securityConfig" -}}
{{- $s := .root.Values.security -}}
{{- $gen := .gen -}}
{{- $external := .root.Values.externalAccess.enabled -}}
{{- $tlsProtocols := list "SSL" "SASL_SSL" -}}
{{- $saslProtocols := list "SASL_PLAINTEXT" "SASL_SSL" -}}
{{- $usesTls := or (has $s.protocol $tlsProtocols) (and $external (has $s.externalProtocol $tlsProtocols)) $s.interNodeTls -}}
{{- $usesSasl := or (has $s.protocol $saslProtocols) (and $external (has $s.externalProtocol $saslProtocols)) -}}
{{- if and $usesTls (not $s.tlsSecret) -}}
{{- fail "security: an SSL or SASL_SSL listener, or interNodeTls, needs security.tlsSecret (a Secret with tls.crt, tls.key and ca.crt)" -}}
{{- end -}}
{{- if ne $s.protocol "PLAINTEXT" -}}
{{- $_ := set $gen "security_protocol" $s.protocol -}}
{{- end -}}
{{- if and $external (ne $s.externalProtocol "PLAINTEXT") -}}
{{- $_ := set $gen (printf "listeners.%s.security_protocol" .root.Values.externalAccess.listenerName) $s.externalProtocol -}}
{{- end -}}
{{- if $s.tlsSecret -}}
{{- $_ := set $gen "ssl_cert_file" "/etc/samsa-tls/tls.crt" -}}
{{- $_ := set $gen "ssl_key_file" "/etc/samsa-tls/tls.key" -}}
{{- $_ := set $gen "ssl_ca_file" "/etc/samsa-tls/ca.crt" -}}
{{- $_ := set $gen "ssl_client_auth" $s.clientAuth -}}
{{- end -}}
{{- if $usesSasl -}}
{{- $_ := set $gen "sasl_enabled_mechanisms" $s.saslMechanisms -}}
{{- end -}}
{{- if $s.interNodeTls -}}
{{- $_ := set $gen "inter_node_tls_cert_file" "/etc/samsa-tls/tls.crt" -}}
{{- $_ := set $gen "inter_node_tls_key_file" "/etc/samsa-tls/tls.key" -}}
{{- $_ := set $gen "inter_node_tls_ca_file" "/etc/samsa-tls/ca.crt" -}}
{{- end -}}
{{- if $s.adminListener -}}
{{- $_ := set $gen "listeners.admin.listen" (printf "127.0.0.1:%d" (int $s.adminPort)) -}}
{{- end -}}
{{- if $s.authorizer.enabled -}}
{{- $superUsers := $s.authorizer.superUsers -}}
{{- if $s.adminListener -}}
{{- $superUsers = append $superUsers "User:ANONYMOUS" | uniq -}}
{{- end -}}
{{- $_ := set $gen "authorizer_enable" true -}}
{{- if $superUsers -}}
{{- $_ := set $gen "super_users" $superUsers -}}
{{- end -}}
{{- if $s.authorizer.allowEveryoneIfNoAclFound -}}
{{- $_ := set $gen "allow_everyone_if_no_acl_found" true -}}
{{- end -}}
{{- end -}}
{{- if $s.usersSecret -}}
{{- $_ := set $gen "scram_users_dir" "/etc/samsa-users" -}}
{{- end -}}
{{- if $s.authorizer.acls -}}
{{- if not $s.authorizer.enabled -}}
{{- fail "security.authorizer.acls needs security.authorizer.enabled: nothing would judge by them" -}}
{{- end -}}
{{- $acls := list -}}
{{- range $a := $s.authorizer.acls -}}
{{- $acl := dict "principal" $a.principal "resource_type" $a.resourceType "operation" $a.operation -}}
{{- range $from, $to := dict "resourceName" "resource_name" "patternType" "pattern_type" "permission" "permission" "host" "host" -}}
{{- if hasKey $a $from -}}
{{- $_ := set $acl $to (get $a $from) -}}
{{- end -}}
{{- end -}}
{{- $acls = append $acls $acl -}}
{{- end -}}
{{- $_ := set $gen "acls" $acls -}}
{{- end -}}
{{- end -}}
