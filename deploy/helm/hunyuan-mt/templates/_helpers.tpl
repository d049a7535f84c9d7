{{/* Names and labels. */}}
{{- define "hunyuan-mt.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "hunyuan-mt.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "hunyuan-mt.labels" -}}
{{ include "hunyuan-mt.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "hunyuan-mt.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "hunyuan-mt.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "hunyuan-mt.workdir" -}}/home/model-server/run{{- end -}}

{{- define "hunyuan-mt.gracePeriod" -}}
{{- if .Values.terminationGracePeriodSeconds -}}
{{- .Values.terminationGracePeriodSeconds -}}
{{- else -}}
{{- add .Values.drain.endpointWaitSeconds .Values.drain.drainTimeoutSeconds .Values.drain.stopSeconds -}}
{{- end -}}
{{- end -}}

{{/*
TorchServe's addresses, the chart's alone: loopback unless torchserve.exposeDirect (inference)
or metrics.expose (metrics); management never leaves the pod. The Service, the NetworkPolicy
and the container ports follow the same two values.
*/}}
{{- define "hunyuan-mt.addresses" -}}
inference_address: http://{{ ternary "0.0.0.0" "127.0.0.1" .Values.torchserve.exposeDirect }}:8080
management_address: http://127.0.0.1:8081
metrics_address: http://{{ ternary "0.0.0.0" "127.0.0.1" .Values.metrics.expose }}:8082
{{- end -}}

{{/*
Refuses values that contradict each other, and values of earlier versions of the chart that
would otherwise be ignored without a word (Helm does not check keys).
*/}}
{{- define "hunyuan-mt.checkValues" -}}
{{- range $key := keys (fromYaml (include "hunyuan-mt.addresses" $)) | sortAlpha -}}
{{- if hasKey $.Values.torchserve.config $key -}}
{{- fail (printf "torchserve.config.%s: the chart sets TorchServe's addresses (torchserve.exposeDirect, metrics.expose)" $key) -}}
{{- end -}}
{{- end -}}
{{- range $old, $now := dict "enabled" "the front end is always the pod's door" "threads" "the front end's own default applies" -}}
{{- if hasKey $.Values.web $old -}}
{{- fail (printf "web.%s was removed: %s (docs/kubernetes.md)" $old $now) -}}
{{- end -}}
{{- end -}}
{{- if hasKey .Values.networkPolicy "extraMetricsFrom" -}}
{{- fail "networkPolicy.extraMetricsFrom was renamed networkPolicy.metricsFrom: the only peers admitted to port 8082" -}}
{{- end -}}
{{- $database := .Values.web.database -}}
{{- $several := or (gt (int .Values.replicas) 1) .Values.autoscaling.enabled (and .Values.kserve.enabled (gt (int .Values.kserve.maxReplicas) 1)) -}}
{{- if and $database.existingSecret $database.sqliteClaim -}}
{{- fail "web.database: existingSecret (PostgreSQL) or sqliteClaim (SQLite), not both" -}}
{{- end -}}
{{- if and $several (not $database.existingSecret) -}}
{{- fail "several replicas need web.database.existingSecret, a Secret with a PostgreSQL URL: each pod's own SQLite would count the keys' usage apart (docs/database.md)" -}}
{{- end -}}
{{- if and .Values.kserve.enabled .Values.torchserve.exposeDirect -}}
{{- fail "torchserve.exposeDirect is for the Deployment: KServe's Service routes to the predictor's first container, the front end, which answers the whole v2 protocol" -}}
{{- end -}}
{{- if and .Values.autoscaling.enabled (not .Values.metrics.expose) -}}
{{- fail "autoscaling.enabled needs metrics.expose: the HPA's metric comes from Prometheus scraping TorchServe's port 8082" -}}
{{- end -}}
{{- end -}}

{{/*
config.properties as `hymt start` renders it (properties.render_config + write_properties):
the file's key=value lines in order (a repeated key keeps its first place and its last value),
overrides (torchserve.config and the addresses) replacing values in place, new keys after them
in key order, one header line. tests/unit/test_helm_chart.py compares this with hymt's own
rendering.
*/}}
{{- define "hunyuan-mt.configProperties" -}}
{{- $overrides := merge (fromYaml (include "hunyuan-mt.addresses" .)) .Values.torchserve.config -}}
{{- $keys := list -}}
{{- $values := dict -}}
{{- range $line := .Files.Lines "files/config.properties" -}}
{{- $text := trim $line -}}
{{- if and $text (not (hasPrefix "#" $text)) (not (hasPrefix "!" $text)) (contains "=" $text) -}}
{{- $pair := splitn "=" 2 $text -}}
{{- $key := trim $pair._0 -}}
{{- if not (hasKey $values $key) -}}{{- $keys = append $keys $key -}}{{- end -}}
{{- $_ := set $values $key (trim $pair._1) -}}
{{- end -}}
{{- end -}}
{{- range $key := keys $overrides | sortAlpha -}}
{{- $value := toString (index $overrides $key) -}}
{{- if contains "{model_store}" $value -}}
{{- fail (printf "torchserve.config.%s: write the model store's path instead of {model_store}" $key) -}}
{{- end -}}
{{- if not (hasKey $values $key) -}}{{- $keys = append $keys $key -}}{{- end -}}
{{- $_ := set $values $key $value -}}
{{- end -}}
{{- range $key := list "model_store" "metrics_config" "workflow_store" "keystore" "private_key_file" "certificate_file" "plugins_path" -}}
{{- $path := get $values $key -}}
{{- if and $path (not (isAbs $path)) -}}
{{- fail (printf "config.properties: %s must be an absolute path, got %s" $key $path) -}}
{{- end -}}
{{- end -}}
# rendered by hymt start from the project's config; edit the source, not this
{{ range $key := $keys -}}
{{ $key }}={{ get $values $key }}
{{ end -}}
{{- end -}}

{{/* The model folder's volume. */}}
{{- define "hunyuan-mt.modelVolume" -}}
{{- if and (eq .Values.model.source "init") (eq .Values.model.init.target "emptyDir") -}}
- name: model
  emptyDir:
    sizeLimit: {{ .Values.model.init.sizeLimit }}
{{- else -}}
- name: model
  persistentVolumeClaim:
    claimName: {{ required "model.pvc.existingClaim is required" .Values.model.pvc.existingClaim }}
    readOnly: {{ eq .Values.model.source "pvc" }}
{{- end -}}
{{- end -}}

{{/* The init container that copies the model from object storage (model.source: init). */}}
{{- define "hunyuan-mt.initContainers" -}}
{{- if eq .Values.model.source "init" }}
- name: fetch-model
  image: {{ .Values.model.init.image }}
  command: {{ toJson .Values.model.init.command }}
  {{- with .Values.model.init.env }}
  env: {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.model.init.existingSecret }}
  envFrom:
    - secretRef:
        name: {{ . }}
  {{- end }}
  securityContext: {{- include "hunyuan-mt.containerSecurity" . | nindent 4 }}
  resources: {{- toYaml .Values.model.init.resources | nindent 4 }}
  volumeMounts:
    - name: model
      mountPath: {{ .Values.model.mountPath }}
      {{- if and (eq .Values.model.init.target "pvc") .Values.model.pvc.subPath }}
      subPath: {{ .Values.model.pvc.subPath }}
      {{- end }}
    - name: tmp
      mountPath: /tmp
{{- else if ne .Values.model.source "pvc" -}}
{{- fail (printf "model.source must be pvc or init, got %s" .Values.model.source) -}}
{{- end -}}
{{- end -}}

{{- define "hunyuan-mt.containerSecurity" -}}
runAsNonRoot: true
runAsUser: 1000
runAsGroup: 1000
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: ["ALL"]
{{- end -}}

{{/* Volumes of the pod: model, config, the client keys, and the writable folders of a
read-only root. */}}
{{- define "hunyuan-mt.volumes" -}}
{{ include "hunyuan-mt.modelVolume" . }}
- name: config
  configMap:
    name: {{ include "hunyuan-mt.fullname" . }}
- name: run
  emptyDir: {}
- name: model-store
  emptyDir: {}
- name: tmp
  emptyDir: {}
- name: cache
  emptyDir: {}
{{- if .Values.compileCache.existingClaim }}
- name: compile-cache
  persistentVolumeClaim:
    claimName: {{ .Values.compileCache.existingClaim }}
{{- else }}
- name: compile-cache
  emptyDir:
    sizeLimit: {{ .Values.compileCache.sizeLimit }}
{{- end }}
- name: dshm
  emptyDir:
    medium: Memory
    sizeLimit: {{ .Values.shmSize }}
- name: web-keys
  secret:
    secretName: {{ required "web.existingSecret is required: the Secret with web_keys.json, the front end's client keys" .Values.web.existingSecret }}
    defaultMode: 0440
{{- with .Values.web.database.sqliteClaim }}
- name: database
  persistentVolumeClaim:
    claimName: {{ . }}
{{- end }}
{{- end -}}

{{/* The TorchServe container (Deployment and KServe predictor alike). It declares only the
ports bound beyond the pod's loopback (hunyuan-mt.addresses); its probes and preStop are
commands run inside the container, so they reach TorchServe on loopback. */}}
{{- define "hunyuan-mt.torchserveContainer" -}}
{{- $workdir := include "hunyuan-mt.workdir" . -}}
- name: torchserve
  image: "{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}"
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  env:
    - name: HYMT_MODEL_PATH
      value: {{ .Values.model.mountPath | quote }}
    - name: HYMT_PROFILE
      value: {{ .Values.profile | quote }}
    - name: HYMT_WORKERS
      value: {{ mul .Values.gpus .Values.workersPerGpu | quote }}
    - name: HYMT_START_TIMEOUT
      value: {{ .Values.startTimeoutSeconds | quote }}
    # Compile caches on the writable cache volume (the root file system is read-only).
    - name: XDG_CACHE_HOME
      value: /home/model-server/.cache
    - name: TRITON_CACHE_DIR
      value: /home/model-server/.cache/triton
    - name: TORCHINDUCTOR_CACHE_DIR
      value: /home/model-server/.cache/inductor
    - name: TRITON_HOME
      value: /home/model-server/.cache
    - name: CUDA_CACHE_PATH
      value: /home/model-server/.cache/nv
    # The fast engine's compile cache (compileCache), reused by the next start on this volume.
    - name: HYMT_COMPILE_CACHE_DIR
      value: {{ .Values.compileCache.mountPath | quote }}
  {{- if or .Values.torchserve.exposeDirect .Values.metrics.expose }}
  ports:
    {{- if .Values.torchserve.exposeDirect }}
    - name: http
      containerPort: 8080
      protocol: TCP
    {{- end }}
    {{- if .Values.metrics.expose }}
    - name: metrics
      containerPort: 8082
      protocol: TCP
    {{- end }}
  {{- end }}
  resources:
    {{- $resources := deepCopy .Values.resources }}
    {{- $limits := default dict $resources.limits }}
    {{- $_ := set $limits "nvidia.com/gpu" .Values.gpus }}
    {{- $_ := set $resources "limits" $limits }}
    {{- toYaml $resources | nindent 4 }}
  securityContext: {{- include "hunyuan-mt.containerSecurity" . | nindent 4 }}
  startupProbe:
    exec:
      command: ["hymt", "health", "--workdir", {{ $workdir | quote }}]
    periodSeconds: 10
    timeoutSeconds: 30
    failureThreshold: {{ div .Values.probes.startupSeconds 10 }}
  readinessProbe:
    exec:
      command: ["hymt", "health", "--workdir", {{ $workdir | quote }}, "--timeout", {{ .Values.probes.readiness.translationTimeoutSeconds | quote }}]
    periodSeconds: {{ .Values.probes.readiness.periodSeconds }}
    timeoutSeconds: {{ add .Values.probes.readiness.translationTimeoutSeconds 22 }}
    failureThreshold: {{ .Values.probes.readiness.failureThreshold }}
  livenessProbe:
    exec:
      command: ["hymt", "health", "--liveness", "--workdir", {{ $workdir | quote }}]
    periodSeconds: {{ .Values.probes.liveness.periodSeconds }}
    timeoutSeconds: 30
    failureThreshold: {{ .Values.probes.liveness.failureThreshold }}
  lifecycle:
    preStop:
      exec:
        command: ["hymt", "drain", "--workdir", {{ $workdir | quote }}, "--endpoint-wait", {{ .Values.drain.endpointWaitSeconds | quote }}, "--timeout", {{ .Values.drain.drainTimeoutSeconds | quote }}]
  volumeMounts:
    - name: model
      mountPath: {{ .Values.model.mountPath }}
      readOnly: true
      {{- if and .Values.model.pvc.subPath (or (eq .Values.model.source "pvc") (eq .Values.model.init.target "pvc")) }}
      subPath: {{ .Values.model.pvc.subPath }}
      {{- end }}
    # The rendered config.properties in place of the image's (the entrypoint's --config).
    - name: config
      mountPath: /home/model-server/docker/config.properties
      subPath: config.properties
      readOnly: true
    - name: run
      mountPath: {{ $workdir }}
    - name: model-store
      mountPath: /home/model-server/model_store
    - name: tmp
      mountPath: /tmp
    - name: cache
      mountPath: /home/model-server/.cache
    - name: compile-cache
      mountPath: {{ .Values.compileCache.mountPath }}
      {{- with .Values.compileCache.subPath }}
      subPath: {{ . }}
      {{- end }}
    - name: dshm
      mountPath: /dev/shm
{{- end -}}

{{/* Pod-level settings shared by the Deployment and the KServe predictor. */}}
{{- define "hunyuan-mt.podSettings" -}}
serviceAccountName: {{ include "hunyuan-mt.serviceAccountName" . }}
automountServiceAccountToken: false
terminationGracePeriodSeconds: {{ include "hunyuan-mt.gracePeriod" . }}
securityContext:
  runAsNonRoot: true
  runAsUser: 1000
  runAsGroup: 1000
  fsGroup: 1000
  seccompProfile:
    type: RuntimeDefault
{{- with .Values.imagePullSecrets }}
imagePullSecrets: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.nodeSelector }}
nodeSelector: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.affinity }}
affinity: {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}


{{/* The front end (`hymt web`), the pod's door; the context is the chart's with containerName
added (web, or kserve-container as the KServe predictor's first container). It reads
run/config.properties for TorchServe's addresses: the ConfigMap's copy is mounted there, the
same text `hymt start` writes in the TorchServe container (a test checks), so the front end
starts without waiting for it. TorchServe's keys, the drain marker and the usage file are in
the shared run/; the client keys are the Secret's web_keys.json, where `hymt web` reads them by
default. Probes: its own routes (/v2/health/live: the front end answers; /v2/health/ready:
every TorchServe worker READY and no drain under way). It drains with the pod. */}}
{{- define "hunyuan-mt.webContainer" -}}
{{- $workdir := include "hunyuan-mt.workdir" . -}}
- name: {{ .containerName }}
  image: "{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}"
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  command: ["hymt", "web", "--host", "0.0.0.0", "--port", {{ .Values.web.port | quote }}, "--workdir", {{ $workdir | quote }}]
  {{- with .Values.web.database }}
  {{- if or .existingSecret .sqliteClaim }}
  env:
    # The keys' database (docs/database.md): PostgreSQL from the Secret, or SQLite on the claim.
    - name: HYMT_DATABASE_URL
      {{- if .existingSecret }}
      valueFrom:
        secretKeyRef:
          name: {{ .existingSecret }}
          key: {{ .secretKey }}
      {{- else }}
      value: {{ printf "sqlite:///%s/hymt.db" .sqliteMountPath | quote }}
      {{- end }}
  {{- end }}
  {{- end }}
  ports:
    - name: web
      containerPort: {{ .Values.web.port }}
      protocol: TCP
  resources: {{- toYaml .Values.web.resources | nindent 4 }}
  securityContext: {{- include "hunyuan-mt.containerSecurity" . | nindent 4 }}
  readinessProbe:
    httpGet:
      path: /v2/health/ready
      port: web
    periodSeconds: 10
    timeoutSeconds: 5
    failureThreshold: 3
  livenessProbe:
    httpGet:
      path: /v2/health/live
      port: web
    periodSeconds: 30
    timeoutSeconds: 5
    failureThreshold: 5
  lifecycle:
    preStop:
      exec:
        command: ["hymt", "drain", "--workdir", {{ $workdir | quote }}, "--endpoint-wait", {{ .Values.drain.endpointWaitSeconds | quote }}, "--timeout", {{ .Values.drain.drainTimeoutSeconds | quote }}]
  volumeMounts:
    - name: run
      mountPath: {{ $workdir }}
    - name: config
      mountPath: {{ $workdir }}/config.properties
      subPath: config.properties
      readOnly: true
    - name: web-keys
      mountPath: {{ $workdir }}/web_keys.json
      subPath: web_keys.json
      readOnly: true
    - name: tmp
      mountPath: /tmp
    {{- if .Values.web.database.sqliteClaim }}
    - name: database
      mountPath: {{ .Values.web.database.sqliteMountPath }}
    {{- end }}
{{- end -}}


{{/* The pod's containers: the front end first (KServe builds its Service from the first
container's ports), then TorchServe. The context is the chart's with webName added. */}}
{{- define "hunyuan-mt.containers" -}}
{{ include "hunyuan-mt.webContainer" (merge (dict "containerName" .webName) .) }}
{{ include "hunyuan-mt.torchserveContainer" . }}
{{- end -}}
