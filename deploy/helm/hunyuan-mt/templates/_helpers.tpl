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
config.properties as `hymt start` renders it (properties.render_config + write_properties):
the file's key=value lines in order (a repeated key keeps its first place and its last value),
overrides replacing values in place, new keys after them in key order, one header line.
tests/unit/test_helm_chart.py compares this with hymt's own rendering.
*/}}
{{- define "hunyuan-mt.configProperties" -}}
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
{{- range $key := keys .Values.torchserve.config | sortAlpha -}}
{{- $value := toString (index $.Values.torchserve.config $key) -}}
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

{{/* Volumes of the pod: model, config, and the writable folders of a read-only root. */}}
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
- name: dshm
  emptyDir:
    medium: Memory
    sizeLimit: {{ .Values.shmSize }}
{{- end -}}

{{/* The TorchServe container (Deployment and KServe predictor alike); the context is the
chart's with containerName and kserve (true: the inference port only) added. */}}
{{- define "hunyuan-mt.container" -}}
{{- $workdir := include "hunyuan-mt.workdir" . -}}
- name: {{ .containerName }}
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
  ports:
    - name: http
      containerPort: 8080
      protocol: TCP
    {{- if not .kserve }}
    - name: management
      containerPort: 8081
      protocol: TCP
    - name: metrics
      containerPort: 8082
      protocol: TCP
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


{{/* The web front end (web.enabled): `hymt web` beside TorchServe, its client keys from the
Secret mounted where it reads them (run/web_keys.json; usage is kept beside, in run/), the
pod's TorchServe key read from the shared run/ folder. It drains with the pod. */}}
{{- define "hunyuan-mt.webContainer" -}}
{{- $workdir := include "hunyuan-mt.workdir" . -}}
- name: web
  image: "{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}"
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  command: ["hymt", "web", "--host", "0.0.0.0", "--port", {{ .Values.web.port | quote }}, "--workdir", {{ $workdir | quote }}, "--threads", {{ .Values.web.threads | quote }}]
  ports:
    - name: web
      containerPort: {{ .Values.web.port }}
      protocol: TCP
  resources: {{- toYaml .Values.web.resources | nindent 4 }}
  securityContext: {{- include "hunyuan-mt.containerSecurity" . | nindent 4 }}
  readinessProbe:
    httpGet:
      path: /
      port: web
    periodSeconds: 10
  livenessProbe:
    httpGet:
      path: /
      port: web
    periodSeconds: 30
    failureThreshold: 5
  lifecycle:
    preStop:
      exec:
        command: ["hymt", "drain", "--workdir", {{ $workdir | quote }}, "--endpoint-wait", {{ .Values.drain.endpointWaitSeconds | quote }}, "--timeout", {{ .Values.drain.drainTimeoutSeconds | quote }}]
  volumeMounts:
    - name: run
      mountPath: {{ $workdir }}
    - name: web-keys
      mountPath: {{ $workdir }}/web_keys.json
      subPath: web_keys.json
      readOnly: true
    - name: tmp
      mountPath: /tmp
{{- end -}}
