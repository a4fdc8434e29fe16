{{/* Names and labels. */}}
{{- define "ibvbridge.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "ibvbridge.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "ibvbridge.labels" -}}
{{ include "ibvbridge.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "ibvbridge.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end -}}

{{/* The ring directory recv makes inside the shared volume (the volume's root is world-writable, which a
ring directory must not be; recv creates this one 0755 and owns it). */}}
{{- define "ibvbridge.ringDir" -}}
{{ trimSuffix "/" .Values.ring.mountPath }}/rings
{{- end -}}

{{/* Capabilities by transport: IPC_LOCK for every one (pinned ring memory); AF_XDP loads an XDP program
and binds a socket to the NIC's queue (NET_ADMIN, NET_RAW, BPF); ibverbs creates raw packet QPs and flow
steering rules (NET_RAW, NET_ADMIN). */}}
{{- define "ibvbridge.capabilities" -}}
{{- $caps := list "IPC_LOCK" -}}
{{- if eq .Values.transport "xdp" -}}
{{- $caps = concat $caps (list "NET_ADMIN" "NET_RAW" "BPF") -}}
{{- else if eq .Values.transport "ibv" -}}
{{- $caps = concat $caps (list "NET_ADMIN" "NET_RAW") -}}
{{- end -}}
{{- $caps = concat $caps .Values.securityContext.extraCapabilities | uniq -}}
{{- toJson $caps -}}
{{- end -}}

{{/* Hugepages and device-plugin resources: requests = limits. */}}
{{- define "ibvbridge.resources" -}}
{{- $req := deepCopy (.Values.resources.requests | default dict) -}}
{{- $lim := deepCopy (.Values.resources.limits | default dict) -}}
{{- if .Values.hugepages.enabled -}}
{{- $hp := printf "hugepages-%s" .Values.hugepages.pageSize -}}
{{- $_ := set $req $hp .Values.hugepages.size -}}
{{- $_ := set $lim $hp .Values.hugepages.size -}}
{{- end -}}
{{- range $k, $v := .Values.deviceResources -}}
{{- $_ := set $req $k (toString $v) -}}
{{- $_ := set $lim $k (toString $v) -}}
{{- end -}}
{{- toJson (dict "requests" $req "limits" $lim) -}}
{{- end -}}
