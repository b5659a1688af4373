{{/* Names and labels shared by every object of the release. */}}

{{- define "brimful.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "brimful.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Selector labels of one component (api, batcher): stable across upgrades. */}}
{{- define "brimful.selector" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "brimful.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "brimful.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- .Values.serviceAccount.name | default (include "brimful.fullname" .) -}}
{{- else -}}
{{- .Values.serviceAccount.name | default "default" -}}
{{- end -}}
{{- end -}}

{{/* The Secret holding credentials: the user's own, or the one this chart makes. */}}
{{- define "brimful.secretName" -}}
{{- printf "%s-credentials" (include "brimful.fullname" .) -}}
{{- end -}}

{{/* The model endpoints: as given, or the headless Service this chart makes. */}}
{{- define "brimful.modelEndpoints" -}}
{{- if .Values.model.endpoints -}}
{{- .Values.model.endpoints -}}
{{- else if .Values.model.headlessService.create -}}
{{- printf "%s-models:%v" (include "brimful.fullname" .) .Values.model.headlessService.grpcPort -}}
{{- else -}}
{{- fail "model.endpoints is empty and model.headlessService.create is off: name the Triton endpoints" -}}
{{- end -}}
{{- end -}}

{{/* The models served, the default first. */}}
{{- define "brimful.models" -}}
{{- prepend .Values.model.others .Values.model.name | toJson -}}
{{- end -}}

{{/* What a model's batcher objects add to their names and component label: nothing for
the default model (its objects keep the names of a chart serving one model), else the
model's name made fit for Kubernetes. */}}
{{- define "brimful.batcherSuffix" -}}
{{- if ne .index 0 -}}
-{{ .model | lower | replace "_" "-" | replace "." "-" | trunc 40 | trimSuffix "-" }}
{{- end -}}
{{- end -}}

{{- define "brimful.checks" -}}
{{- $suffixes := list -}}
{{- range $index, $model := include "brimful.models" . | fromJsonArray -}}
{{- $suffixes = append $suffixes (include "brimful.batcherSuffix" (dict "index" 1 "model" $model)) -}}
{{- end -}}
{{- if ne (len $suffixes) (len (uniq $suffixes)) -}}
{{- fail (printf "model.name and model.others name the same model twice, or two whose Kubernetes names collide: %v" $suffixes) -}}
{{- end -}}
{{- if gt (int .Values.batcher.keda.maxReplicaCount) (int .Values.kafka.partitions) -}}
{{- fail (printf "batcher.keda.maxReplicaCount (%v) exceeds kafka.partitions (%v): a batcher beyond the partition count owns nothing" .Values.batcher.keda.maxReplicaCount .Values.kafka.partitions) -}}
{{- end -}}
{{- if gt (int .Values.batcher.replicas) (int .Values.kafka.partitions) -}}
{{- fail (printf "batcher.replicas (%v) exceeds kafka.partitions (%v)" .Values.batcher.replicas .Values.kafka.partitions) -}}
{{- end -}}
{{- if and .Values.model.headlessService.create (not .Values.model.headlessService.selector) -}}
{{- fail "model.headlessService.selector must name the labels of your Triton pods" -}}
{{- end -}}
{{- if and .Values.auth.enabled .Values.auth.existingSecret .Values.auth.apiKey -}}
{{- fail "set auth.existingSecret or auth.apiKey, not both" -}}
{{- end -}}
{{- end -}}

{{/* Environment both processes read: the settings this chart owns, then extraEnv. */}}
{{- define "brimful.env" -}}
- name: BRIMFUL_KAFKA_BOOTSTRAP
  value: {{ .Values.kafka.bootstrap | quote }}
- name: BRIMFUL_TOPIC_PARTITIONS
  value: {{ .Values.kafka.partitions | quote }}
- name: BRIMFUL_TOPIC_REPLICATION
  value: {{ .Values.kafka.replication | quote }}
- name: BRIMFUL_KAFKA_IDEMPOTENCE
  value: {{ .Values.kafka.idempotence | quote }}
- name: BRIMFUL_KAFKA_FETCH_MAX_WAIT_MS
  value: {{ .Values.kafka.fetchMaxWaitMs | quote }}
- name: BRIMFUL_KAFKA_SECURITY_PROTOCOL
  value: {{ .Values.kafka.securityProtocol | quote }}
{{- if hasPrefix "SASL" .Values.kafka.securityProtocol }}
- name: BRIMFUL_KAFKA_SASL_MECHANISM
  value: {{ .Values.kafka.sasl.mechanism | quote }}
- name: BRIMFUL_KAFKA_SASL_USERNAME
  value: {{ .Values.kafka.sasl.username | quote }}
- name: BRIMFUL_KAFKA_SASL_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ .Values.kafka.sasl.existingSecret | default (include "brimful.secretName" .) }}
      key: {{ .Values.kafka.sasl.passwordKey }}
{{- end }}
{{- if .Values.kafka.tls.existingSecret }}
- name: BRIMFUL_KAFKA_SSL_CAFILE
  value: /etc/brimful/kafka-tls/{{ .Values.kafka.tls.caKey }}
{{- if .Values.kafka.tls.certKey }}
- name: BRIMFUL_KAFKA_SSL_CERTFILE
  value: /etc/brimful/kafka-tls/{{ .Values.kafka.tls.certKey }}
- name: BRIMFUL_KAFKA_SSL_KEYFILE
  value: /etc/brimful/kafka-tls/{{ .Values.kafka.tls.keyKey }}
{{- end }}
{{- end }}
- name: BRIMFUL_REDIS_URL
  valueFrom:
    secretKeyRef:
      name: {{ .Values.redis.existingSecret | default (include "brimful.secretName" .) }}
      key: {{ .Values.redis.urlKey }}
- name: BRIMFUL_REDIS_CLUSTER
  value: {{ .Values.redis.cluster | quote }}
- name: BRIMFUL_TRITON_URL
  value: {{ include "brimful.modelEndpoints" . | quote }}
- name: BRIMFUL_TRITON_RESOLVE_DNS
  value: {{ .Values.model.resolveDns | quote }}
- name: BRIMFUL_ENDPOINT_RESOLVE_S
  value: {{ .Values.model.resolveSeconds | quote }}
- name: BRIMFUL_ENDPOINT_CAPACITY
  value: {{ .Values.model.capacity | quote }}
- name: BRIMFUL_ENDPOINT_INSTANCES
  value: {{ .Values.model.instances | quote }}
- name: BRIMFUL_MODELS
  value: {{ include "brimful.models" . | fromJsonArray | join "," | quote }}
- name: BRIMFUL_MODEL_VERSION
  value: {{ .Values.model.version | quote }}
- name: BRIMFUL_BATCH_SIZE
  value: {{ .Values.model.batchSize | quote }}
- name: BRIMFUL_INFER_TIMEOUT_S
  value: {{ .Values.model.inferTimeoutSeconds | quote }}
- name: BRIMFUL_AUTH_ENABLED
  value: {{ .Values.auth.enabled | quote }}
{{- if or .Values.auth.existingSecret .Values.auth.apiKey }}
- name: BRIMFUL_API_KEY
  valueFrom:
    secretKeyRef:
      name: {{ .Values.auth.existingSecret | default (include "brimful.secretName" .) }}
      key: {{ .Values.auth.apiKeyKey }}
{{- end }}
{{- range $name, $value := .Values.extraEnv }}
- name: {{ $name }}
  value: {{ $value | quote }}
{{- end }}
{{- end -}}

{{- define "brimful.volumes" -}}
- name: tmp
  emptyDir: {}
{{- if .Values.kafka.tls.existingSecret }}
- name: kafka-tls
  secret:
    secretName: {{ .Values.kafka.tls.existingSecret }}
{{- end }}
{{- end -}}

{{- define "brimful.volumeMounts" -}}
# The root filesystem is read-only; the API's workers share their metrics under /tmp.
- name: tmp
  mountPath: /tmp
{{- if .Values.kafka.tls.existingSecret }}
- name: kafka-tls
  mountPath: /etc/brimful/kafka-tls
  readOnly: true
{{- end }}
{{- end -}}
