{{- /*
    Names. meterhub's objects carry the same prefix as the zero-to-jupyterhub subchart's
    own ("hub", "proxy-public", ...), so they collide exactly when z2jh's would: with z2jh's
    default `jupyterhub.fullnameOverride: ""` there is no prefix (one release per
    namespace); a second release in a namespace sets a distinct `jupyterhub.fullnameOverride`,
    or null for `<release>-jupyterhub`.

    The "meterhub.jupyterhub.*" helpers follow z2jh's own (jupyterhub/templates/
    _helpers-names.tpl: "jupyterhub.fullname", "jupyterhub.fullname.dash",
    "jupyterhub.hub.fullname", "jupyterhub.hub-existing-secret-or-default.fullname"), read
    from this parent chart: the name is the subchart's, "jupyterhub", where z2jh's would
    take the calling chart's (helm/helm#9214), and the subchart need not be present to render.
*/}}
{{- define "meterhub.jupyterhub.fullname" -}}
{{- $z2jh := .Values.jupyterhub | default dict -}}
{{- /* a null override is removed from the values: absent, not "" (sprig's `get` default) */ -}}
{{- if and (hasKey $z2jh "fullnameOverride") (kindIs "string" $z2jh.fullnameOverride) -}}
{{- $z2jh.fullnameOverride -}}
{{- else -}}
{{- $name := get $z2jh "nameOverride" | default "jupyterhub" -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name -}}
{{- end -}}
{{- end -}}
{{- end }}

{{- define "meterhub.jupyterhub.fullname.dash" -}}
{{- with include "meterhub.jupyterhub.fullname" . -}}{{ . }}-{{- end -}}
{{- end }}

{{/* z2jh's hub Service and Secret */}}
{{- define "meterhub.jupyterhub.hub.fullname" -}}
{{- include "meterhub.jupyterhub.fullname.dash" . }}hub
{{- end }}

{{/* The hub API as meterhub's pods reach it, under jupyterhub.hub.baseUrl (where the hub
    serves it) */}}
{{- define "meterhub.jupyterhub.hub.apiUrl" -}}
{{- printf "http://%s:8081%shub/api" (include "meterhub.jupyterhub.hub.fullname" .) (include "meterhub.baseUrl" .) -}}
{{- end }}

{{/* z2jh's Services in front of the proxy (configurable-http-proxy): proxy-public, and
    proxy-http, which z2jh adds when its autohttps pod (Let's Encrypt) holds proxy-public */}}
{{- define "meterhub.jupyterhub.proxy-public.fullname" -}}
{{- include "meterhub.jupyterhub.fullname.dash" . }}proxy-public
{{- end }}

{{- define "meterhub.jupyterhub.proxy-http.fullname" -}}
{{- include "meterhub.jupyterhub.fullname.dash" . }}proxy-http
{{- end }}

{{/* The Secret holding hub.services.billing.apiToken (z2jh: hub.existingSecret or its own) */}}
{{- define "meterhub.jupyterhub.hub-secret" -}}
{{- $hub := dig "hub" dict (.Values.jupyterhub | default dict) -}}
{{- get $hub "existingSecret" | default (include "meterhub.jupyterhub.hub.fullname" .) -}}
{{- end }}

{{/* The prefix of every meterhub object: "meterhub" after z2jh's prefix */}}
{{- define "meterhub.fullname" -}}
{{- include "meterhub.jupyterhub.fullname.dash" . }}meterhub
{{- end }}

{{- define "meterhub.billing.fullname" -}}
{{- include "meterhub.fullname" . }}-billing
{{- end }}

{{- define "meterhub.ssh.fullname" -}}
{{- include "meterhub.fullname" . }}-ssh
{{- end }}

{{- define "meterhub.site.fullname" -}}
{{- include "meterhub.fullname" . }}-site
{{- end }}

{{/* The pre-install/pre-upgrade Job running `meterhub billing upgrade-db`, and its copies of
    the site ConfigMap and the database Secret (hooks run before the release's own exist) */}}
{{- define "meterhub.upgradeDb.fullname" -}}
{{- include "meterhub.fullname" . }}-upgrade-db
{{- end }}

{{/* The billing Service as the hub and user pods reach it */}}
{{- define "meterhub.billing.url" -}}
{{- printf "http://%s:8082" (include "meterhub.billing.fullname" .) -}}
{{- end }}

{{/* Labels every meterhub object carries. */}}
{{- define "meterhub.labels" -}}
app.kubernetes.io/name: meterhub
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{/* Selector labels of the billing service's pods. */}}
{{- define "meterhub.billing.selector" -}}
app.kubernetes.io/name: meterhub
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: meterhub-billing
{{- end }}

{{/* Selector labels of the SSH front door's pods. */}}
{{- define "meterhub.ssh.selector" -}}
app.kubernetes.io/name: meterhub
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: meterhub-ssh
{{- end }}

{{/* The Secret holding the SSH front door's host key: the operator's, or the one the chart
    generates once (ssh-secret.yaml) */}}
{{- define "meterhub.ssh.hostKeySecret" -}}
{{- .Values.ssh.hostKey.existingSecret | default (printf "%s-host-key" (include "meterhub.ssh.fullname" .)) -}}
{{- end }}

{{/* The port the SSH front door listens on in its pod: the site config's ssh.port (its
    default is hub/site-schema.yaml's; a test keeps them equal) */}}
{{- define "meterhub.ssh.port" -}}
{{- dig "ssh" "port" 8022 (.Values.site | default dict) | int -}}
{{- end }}

{{/*
    Where the SSH front door reaches users' servers: the proxy, by plain HTTP (the server
    URLs the hub API gives carry jupyterhub.hub.baseUrl, so this is scheme://host[:port]).
    z2jh's proxy-public forwards port 80 to the proxy unless z2jh's autohttps pod holds it
    (Let's Encrypt: then proxy-http, port 8000) or the proxy itself terminates TLS (https
    type manual or secret: its port 8000 only redirects, so ssh.serverUrl must be set).
*/}}
{{- define "meterhub.ssh.serverUrl" -}}
{{- $https := dig "proxy" "https" dict (.Values.jupyterhub | default dict) -}}
{{- $service := dig "proxy" "service" dict (.Values.jupyterhub | default dict) -}}
{{- $type := get $https "type" | default "letsencrypt" -}}
{{- $enabled := get $https "enabled" | default false -}}
{{- if .Values.ssh.serverUrl -}}
{{- .Values.ssh.serverUrl | trimSuffix "/" -}}
{{- else if and $enabled (eq $type "letsencrypt") (get $https "hosts") -}}
{{- printf "http://%s:8000" (include "meterhub.jupyterhub.proxy-http.fullname" .) -}}
{{- else if and $enabled (has $type (list "manual" "secret")) -}}
{{- fail (printf "ssh.serverUrl: jupyterhub.proxy.https.type %s makes the proxy answer plain HTTP with a redirect only; set ssh.serverUrl to an http:// address of the proxy that does not redirect" $type) -}}
{{- else if get $service "disableHttpPort" -}}
{{- if and $enabled (eq $type "offload") -}}
{{- /* offload: proxy-public's port 443 forwards to the proxy's plain HTTP port */ -}}
{{- printf "http://%s:443" (include "meterhub.jupyterhub.proxy-public.fullname" .) -}}
{{- else -}}
{{- fail "ssh.serverUrl: jupyterhub.proxy.service.disableHttpPort leaves proxy-public no plain HTTP port; set ssh.serverUrl" -}}
{{- end -}}
{{- else -}}
{{- printf "http://%s" (include "meterhub.jupyterhub.proxy-public.fullname" .) -}}
{{- end -}}
{{- end }}

{{/* The billing API as a pod of the release reaches it (the SSH front door: prices and the
    user's balance when no server runs) */}}
{{- define "meterhub.billing.apiUrl" -}}
{{- printf "%s%sapi/v1" (include "meterhub.billing.url" .) (include "meterhub.billing.prefix" .) -}}
{{- end }}

{{/* The Secret and key holding the ledger's database URL. */}}
{{- define "meterhub.database.secret" -}}
{{- .Values.billing.database.existingSecret | default (printf "%s-database" (include "meterhub.fullname" .)) -}}
{{- end }}

{{/* The database Secret the upgrade Job reads: the operator's, which exists before the
    release; else the hook copy of the chart's own (created after the hooks on an install) */}}
{{- define "meterhub.upgradeDb.secret" -}}
{{- .Values.billing.database.existingSecret | default (include "meterhub.upgradeDb.fullname" .) -}}
{{- end }}

{{/* The billing image: the hub image, which carries the `meterhub` command. */}}
{{- define "meterhub.billing.image" -}}
{{- printf "%s:%s" .Values.billing.image.name .Values.billing.image.tag | quote -}}
{{- end }}

{{/* What every billing pod (the service, its init container, the upgrade Job) runs as. */}}
{{- define "meterhub.billing.podSecurity" -}}
automountServiceAccountToken: false
{{- with .Values.billing.image.pullSecrets }}
imagePullSecrets:
  {{- range . }}
  - name: {{ . | quote }}
  {{- end }}
{{- end }}
securityContext:
  runAsNonRoot: true
  runAsUser: {{ .Values.billing.uid }}
  runAsGroup: {{ .Values.billing.uid }}
  seccompProfile:
    type: RuntimeDefault
{{- with .Values.billing.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* A billing container's image, security context, resources and site config mount. */}}
{{- define "meterhub.billing.container" -}}
image: {{ include "meterhub.billing.image" . }}
imagePullPolicy: {{ .Values.billing.image.pullPolicy }}
securityContext:
  allowPrivilegeEscalation: false
  capabilities:
    drop: [ALL]
{{- with .Values.billing.resources }}
resources:
  {{- toYaml . | nindent 2 }}
{{- end }}
volumeMounts:
  - name: site
    mountPath: /etc/meterhub
    readOnly: true
  {{- if .Values.billing.database.caSecret }}
  - name: database-ca
    mountPath: /etc/meterhub-db-ca
    readOnly: true
  {{- end }}
{{- end }}

{{/* A billing pod's volumes: the site config (the argument's ConfigMap) and the database CA. */}}
{{- define "meterhub.billing.volumes" -}}
{{- $ := index . 0 -}}
- name: site
  configMap:
    name: {{ index . 1 }}
{{- with $.Values.billing.database.caSecret }}
# only the certificate: a CA Secret may hold the CA's key too (CloudNativePG's does)
- name: database-ca
  secret:
    secretName: {{ . | quote }}
    items:
      - key: ca.crt
        path: ca.crt
{{- end }}
{{- end }}

{{/* The METERHUB_DB_URL env entry from a Secret: (list $ "the Secret's name"). */}}
{{- define "meterhub.database.env" -}}
{{- $ := index . 0 -}}
- name: METERHUB_DB_URL
  valueFrom:
    secretKeyRef:
      name: {{ index . 1 | quote }}
      key: {{ $.Values.billing.database.secretKey | quote }}
{{- end }}

{{/* Site-config keys that only mean something on the local backend, and what to use instead. */}}
{{- define "meterhub.site.localOnly" -}}
auth: "the authenticator is z2jh's: set jupyterhub.hub.config (e.g. hub.config.JupyterHub.authenticator_class)"
gpus: "GPUs come from the nodes (nvidia.com/gpu): map GPU types to node products with site.kubernetes.node_products"
local: "servers are pods: set site.kubernetes (image, disk_size, storage_class, uid)"
data_dir: "the ledger is billing.database and the hub's own database is jupyterhub.hub.db"
{{- end }}

{{/* Site-config `ssh` keys the chart decides on Kubernetes (site.ssh.port stays: the pod's port). */}}
{{- define "meterhub.site.sshChartOwned" -}}
enabled: "set ssh.enabled (the chart's value)"
ip: "its pod listens on all its addresses; ssh.service decides who reaches it"
host_key: "put the key in a Secret and name it in ssh.hostKey.existingSecret"
{{- end }}

{{/* The site config the hub and the billing service read: the user's, on the kubernetes backend. */}}
{{- define "meterhub.site" -}}
{{- range $key, $instead := include "meterhub.site.localOnly" . | fromYaml }}
{{- if hasKey $.Values.site $key }}
{{- fail (printf "site.%s: only used by the local backend; %s" $key $instead) }}
{{- end }}
{{- end }}
{{- /* the site config is a ConfigMap: whoever reads the top-up secret credits any wallet */ -}}
{{- if hasKey (.Values.site.billing | default dict) "topup_secret" }}
{{- fail "site.billing.topup_secret: the site config is a ConfigMap, which is no place for a secret; put it in a Secret and name it in billing.topup.existingSecret (its key in billing.topup.secretKey)" }}
{{- end }}
{{- /* the SSH front door is the chart's Deployment, not a service of the hub */ -}}
{{- range $key, $instead := include "meterhub.site.sshChartOwned" . | fromYaml }}
{{- if hasKey (dig "ssh" dict $.Values.site) $key }}
{{- fail (printf "site.ssh.%s: on Kubernetes the chart runs the SSH front door; %s" $key $instead) }}
{{- end }}
{{- end }}
{{- /* keys naming a GPU type: the schema cannot list the types (a site adds its own) */ -}}
{{- $types := concat (list "rtx4090" "a800" "h800") (keys (.Values.site.gpu_types | default dict)) | uniq | sortAlpha -}}
{{- $kube := .Values.site.kubernetes | default dict -}}
{{- range $where, $named := dict "profiles" (omit (.Values.site.profiles | default dict) "debug") "kubernetes.node_products" ($kube.node_products | default dict) "kubernetes.pass_capacity" ($kube.pass_capacity | default dict) }}
{{- range $slug, $_ := $named }}
{{- if not (has $slug $types) }}
{{- fail (printf "site.%s.%s: unknown GPU type (known: %s)" $where $slug (join ", " $types)) }}
{{- end }}
{{- end }}
{{- end }}
{{- $site := deepCopy .Values.site -}}
{{- $_ := set $site "backend" "kubernetes" -}}
{{- $kube := get $site "kubernetes" | default dict -}}
{{- $_ := set $kube "public_claim" .Values.public.claimName -}}
{{- $_ := set $site "kubernetes" $kube -}}
{{- toYaml $site -}}
{{- end }}

{{/*
    What z2jh's values must name, and cannot template (z2jh does not `tpl` them): the site
    ConfigMap (hub.extraVolumes, hub.extraEnv.METERHUB_BILLING_SERVICE_URL) and the database
    Secret (hub.extraEnv.METERHUB_DB_URL). A mismatch fails with the value to set.
*/}}
{{- define "meterhub.checks" -}}
{{- $hub := dig "hub" dict (.Values.jupyterhub | default dict) -}}
{{- $site := include "meterhub.site.fullname" . -}}
{{- $volumes := list -}}
{{- range (get $hub "extraVolumes" | default list) }}
{{- if and (kindIs "map" .) (hasKey . "configMap") }}
{{- $volumes = append $volumes (dig "configMap" "name" "" .) -}}
{{- end }}
{{- end }}
{{- if not (has $site $volumes) }}
{{- fail (printf "jupyterhub.hub.extraVolumes: the meterhub-site volume must name the ConfigMap %q (this release's site config)" $site) }}
{{- end }}
{{- $billing := dig "extraEnv" "METERHUB_BILLING_SERVICE_URL" "valueFrom" "configMapKeyRef" dict $hub }}
{{- if ne (get $billing "name" | default "") $site }}
{{- fail (printf "jupyterhub.hub.extraEnv.METERHUB_BILLING_SERVICE_URL.valueFrom.configMapKeyRef.name must be %q" $site) }}
{{- end }}
{{- $hubEnv := dig "extraEnv" "METERHUB_DB_URL" "valueFrom" "secretKeyRef" dict $hub }}
{{- if ne (get $hubEnv "name" | default "") (include "meterhub.database.secret" .) }}
{{- fail (printf "jupyterhub.hub.extraEnv.METERHUB_DB_URL.valueFrom.secretKeyRef.name must be %q (the hub writes the ledger too)" (include "meterhub.database.secret" .)) }}
{{- end }}
{{- if ne (get $hubEnv "key" | default "") .Values.billing.database.secretKey }}
{{- fail (printf "jupyterhub.hub.extraEnv.METERHUB_DB_URL.valueFrom.secretKeyRef.key must be %q" .Values.billing.database.secretKey) }}
{{- end }}
{{- include "meterhub.singleuser.checks" . }}
{{- end }}

{{/* The hub's base URL (jupyterhub.hub.baseUrl, z2jh's default "/"), as JupyterHub
    normalizes it: "/" or "/a/b/". */}}
{{- define "meterhub.baseUrl" -}}
{{- $hub := dig "hub" dict (.Values.jupyterhub | default dict) -}}
{{- $stripped := get $hub "baseUrl" | default "/" | trimAll "/" -}}
{{- if $stripped }}/{{ $stripped }}/{{ else }}/{{ end -}}
{{- end }}

{{/* Where JupyterHub puts the billing service, and where the billing pod must serve it:
    the proxy forwards the whole path (hub.k8s.billing_prefix computes the same). */}}
{{- define "meterhub.billing.prefix" -}}
{{- include "meterhub.baseUrl" . }}services/billing/
{{- end }}

{{/*
    z2jh `singleuser` values that set KubeSpawner traits meterhub's KubeGPUSpawner does not
    read (spawner/kube.py OWNED_TRAITS, and the image the site config sets): each is refused
    unless it is what z2jh's chart (or meterhub's values, for storage.type) has, with what to
    set instead. The hub refuses the same traits at start-up (hub/k8s.py Z2JH_OWNED, whose
    texts `instead` repeats; tests/test_helm_chart.py checks they agree). Values at z2jh
    4.3.3's defaults (jupyterhub/values.yaml); a null is absent. storage.dynamic.* and
    storage.static.* are read by z2jh only with storage.type dynamic or static, refused too.
*/}}
{{- define "meterhub.singleuser.refused" -}}
values:
  - {value: image.name, z2jh: quay.io/jupyterhub/k8s-singleuser-sample, trait: image}
  - {value: image.tag, z2jh: "4.3.3", trait: image}
  - {value: profileList, z2jh: [], trait: profile_list}
  - {value: uid, z2jh: 1000, trait: uid}
  - {value: fsGid, z2jh: 100, trait: fs_gid}
  - {value: allowPrivilegeEscalation, z2jh: false, trait: allow_privilege_escalation}
  - {value: storage.type, z2jh: none, trait: volumes}
  - {value: storage.capacity, z2jh: 10Gi, trait: storage_capacity}
  - {value: storage.homeMountPath, z2jh: /home/jovyan, trait: volume_mounts}
  - {value: storage.extraVolumes, z2jh: [], trait: volumes}
  - {value: storage.extraVolumeMounts, z2jh: [], trait: volume_mounts}
  - {value: storage.dynamic.storageClass, z2jh: null, trait: storage_class}
  - {value: storage.dynamic.storageAccessModes, z2jh: [ReadWriteOnce], trait: storage_access_modes}
  - {value: storage.dynamic.pvcNameTemplate, z2jh: null, trait: pvc_name_template}
  - {value: storage.dynamic.volumeNameTemplate, z2jh: "volume-{user_server}", trait: volumes}
  - {value: storage.dynamic.subPath, z2jh: null, trait: volume_mounts}
  - {value: storage.static.pvcName, z2jh: null, trait: volumes}
  - {value: storage.static.subPath, z2jh: "{username}", trait: volume_mounts}
  - {value: extraFiles, z2jh: {}, trait: volumes}
instead:
  image: "set site.kubernetes.image (debug mode, and GPU profiles unless site.kubernetes.gpu_image is set)"
  profile_list: "profiles come from meterhub's catalog: set site.profiles and site.gpu_types"
  uid: "set site.kubernetes.uid"
  fs_gid: "not supported: servers run with fsGroup 100"
  allow_privilege_escalation: "not supported: servers never gain privileges"
  storage_capacity: "set site.kubernetes.disk_size"
  storage_class: "set site.kubernetes.storage_class"
  storage_access_modes: "not supported: each user's disk is ReadWriteOnce"
  pvc_name_template: &storage "not supported: meterhub's spawner owns the servers' storage: one disk per user (claim-{username}, sized by site.kubernetes.disk_size, class site.kubernetes.storage_class), the read-only /public pool (the chart's public.*) and /dev/shm; leave jupyterhub.singleuser.storage.type none"
  volumes: *storage
  volume_mounts: *storage
{{- end }}

{{- define "meterhub.singleuser.checks" -}}
{{- $singleuser := dig "singleuser" dict (.Values.jupyterhub | default dict) -}}
{{- $table := include "meterhub.singleuser.refused" . | fromYaml -}}
{{- range $entry := $table.values }}
{{- $node := $singleuser -}}
{{- $found := true -}}
{{- range $part := splitList "." $entry.value }}
{{- if and $found (kindIs "map" $node) }}
{{- if hasKey $node $part }}
{{- $node = index $node $part -}}
{{- else }}
{{- $found = false -}}
{{- end }}
{{- else }}
{{- $found = false -}}
{{- end }}
{{- end }}
{{- if and $found (not (kindIs "invalid" $node)) (ne (toJson $node) (toJson $entry.z2jh)) }}
{{- $leave := ternary "unset" (printf "at %s" (toJson $entry.z2jh)) (kindIs "invalid" $entry.z2jh) }}
{{- fail (printf "jupyterhub.singleuser.%s: meterhub's spawner does not read it (leave it %s); %s" $entry.value $leave (get $table.instead $entry.trait)) }}
{{- end }}
{{- end }}
{{- /* hub.config lands on c.JupyterHub after z2jh's hub.baseUrl: the billing pod's prefix
    follows hub.baseUrl only */ -}}
{{- $configured := dig "hub" "config" "JupyterHub" "base_url" "" (.Values.jupyterhub | default dict) -}}
{{- if and $configured (ne (trimAll "/" $configured) (trimAll "/" (include "meterhub.baseUrl" .))) }}
{{- fail (printf "jupyterhub.hub.config.JupyterHub.base_url: set jupyterhub.hub.baseUrl: %q instead (the billing service's prefix follows it)" $configured) }}
{{- end }}
{{- end }}

{{/* The Secret and key of the read:metrics token Prometheus sends: the operator's, or the
    token z2jh generates for the `meterhub-metrics` service in its hub Secret. */}}
{{- define "meterhub.metrics.tokenSecret" -}}
{{- with .Values.billing.metrics.token.existingSecret -}}
name: {{ . | quote }}
key: {{ $.Values.billing.metrics.token.secretKey | default "token" | quote }}
{{- else -}}
name: {{ include "meterhub.jupyterhub.hub-secret" . | quote }}
key: hub.services.meterhub-metrics.apiToken
{{- end }}
{{- end }}

{{/* What the SSH front door needs of z2jh's values: its JupyterHub service, whose token z2jh
    generates (hub.services.ssh), and the role that lets that token read users' servers. */}}
{{- define "meterhub.ssh.checks" -}}
{{- $hub := dig "hub" dict (.Values.jupyterhub | default dict) -}}
{{- if not (hasKey (get $hub "services" | default dict) "ssh") }}
{{- fail "jupyterhub.hub.services.ssh: the SSH front door's JupyterHub service is missing (its token is z2jh's hub.services.ssh.apiToken); keep the chart's entry {display: false}" }}
{{- end }}
{{- $role := get (get $hub "loadRoles" | default dict) "meterhub-ssh" | default dict -}}
{{- if not (has "ssh" (get $role "services" | default list)) }}
{{- fail "jupyterhub.hub.loadRoles.meterhub-ssh: the SSH front door's role must list the service ssh (services: [ssh]), or the gateway cannot read whose servers run" }}
{{- end }}
{{- end }}
