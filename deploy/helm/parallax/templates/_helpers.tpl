{{/* The prefix of every object's name: the release name, "parallax" appended unless the
release name already contains it (release "parallax" → parallax-agent, parallax-collector). */}}
{{- define "parallax.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" -}}
{{- else if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "parallax.agent.name" -}}{{ include "parallax.fullname" . }}-agent{{- end -}}
{{- define "parallax.collector.name" -}}{{ include "parallax.fullname" . }}-collector{{- end -}}

{{/* Labels of every object; "component" is agent or collector. The selector is the name
label alone, as in the first plain manifests: a selector cannot change on a live object. */}}
{{- define "parallax.labels" -}}
{{- $ctx := index . 0 -}}{{- $name := index . 1 -}}
app.kubernetes.io/name: {{ $name }}
app.kubernetes.io/part-of: parallax
app.kubernetes.io/instance: {{ $ctx.Release.Name }}
app.kubernetes.io/version: {{ $ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ $ctx.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" $ctx.Chart.Name $ctx.Chart.Version }}
{{- with $ctx.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "parallax.image" -}}
{{- $img := index . 0 -}}{{- $ctx := index . 1 -}}
{{- printf "%s:%s" $img.repository (default $ctx.Chart.AppVersion $img.tag) -}}
{{- end -}}

{{- define "parallax.agent.serviceAccountName" -}}
{{- if .Values.agent.serviceAccount.create -}}
{{- default (include "parallax.agent.name" .) .Values.agent.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.agent.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* A CPU quantity ("500m", "0.5", "2", 2) in millicores. */}}
{{- define "parallax.millicores" -}}
{{- $q := toString . -}}
{{- if hasSuffix "m" $q -}}
{{- trimSuffix "m" $q | float64 -}}
{{- else -}}
{{- mulf (float64 $q) 1000 -}}
{{- end -}}
{{- end -}}

{{/* A memory or storage quantity ("2Gi", "500Mi", "1G", "1048576") in MiB. */}}
{{- define "parallax.mebibytes" -}}
{{- $q := toString . -}}
{{- $units := dict "Ki" 1024.0 "Mi" 1048576.0 "Gi" 1073741824.0 "Ti" 1099511627776.0 "k" 1000.0 "M" 1000000.0 "G" 1000000000.0 "T" 1000000000000.0 -}}
{{- $bytes := 0.0 -}}
{{- $found := false -}}
{{- range $suffix, $mult := $units -}}
{{- if and (not $found) (hasSuffix $suffix $q) -}}
{{- $bytes = mulf (trimSuffix $suffix $q | float64) $mult -}}
{{- $found = true -}}
{{- end -}}
{{- end -}}
{{- if not $found -}}{{- $bytes = float64 $q -}}{{- end -}}
{{- divf $bytes 1048576.0 -}}
{{- end -}}

{{/* The agent's --otlp URL: agent.otlpEndpoint, else this release's collector Service. */}}
{{- define "parallax.agent.otlpEndpoint" -}}
{{- if .Values.agent.otlpEndpoint -}}
{{- .Values.agent.otlpEndpoint -}}
{{- else if .Values.collector.enabled -}}
{{- printf "http://%s.%s.svc:%v" (include "parallax.collector.name" .) .Release.Namespace .Values.collector.ports.ingest -}}
{{- else -}}
{{- fail "agent.otlpEndpoint: required when collector.enabled is false (where do the spans go?)" -}}
{{- end -}}
{{- end -}}

{{/* Refuse values whose consequences only show at run time. */}}
{{- define "parallax.checks" -}}
{{- $a := .Values.agent -}}
{{- if and $a.enabled $a.resources.limits $a.resources.limits.cpu (ne (toString $a.cpuBudget) "0") -}}
{{- $limit := include "parallax.millicores" $a.resources.limits.cpu | float64 -}}
{{- $budget := mulf (ternary 0.4 (float64 $a.cpuBudget) (kindIs "invalid" $a.cpuBudget)) 1000 -}}
{{- if gt $budget (mulf $limit 0.8) -}}
{{- fail (printf "agent: a CPU budget of %vm (agent.cpuBudget; unset: up to 400m) needs resources.limits.cpu of at least %vm (the budget at most 80 %% of the limit): over the limit the kernel throttles the agent into losing events at random, under its budget it samples and counts" $budget (divf $budget 0.8)) -}}
{{- end -}}
{{- end -}}
{{- $c := .Values.collector -}}
{{- if and $c.enabled $c.store.cluster (eq $c.store.type "embedded") -}}
{{- fail "collector.store.cluster: a ClickHouse cluster is a server store; set collector.store.type=server and the Secret's DSN to one of its nodes (the embedded store is one process, not a cluster)" -}}
{{- end -}}
{{- if $c.enabled -}}
{{- $volume := ternary $c.persistence.size $c.persistence.emptyDirSizeLimit $c.persistence.enabled -}}
{{- $spool := ternary 1024 $c.spoolMaxMb (kindIs "invalid" $c.spoolMaxMb) | float64 -}}
{{- $volMiB := include "parallax.mebibytes" $volume | float64 -}}
{{- if and (not $c.persistence.existingClaim) (gt (mulf $spool 2.0) $volMiB) -}}
{{- fail (printf "collector: a spool of %v MiB (collector.spoolMaxMb; unset: 1024) needs a data volume of at least twice that, %v MiB; %s is %v MiB (the volume also holds the segment being written, the quarantine and, embedded, the store)" $spool (mulf $spool 2.0) (ternary "persistence.size" "persistence.emptyDirSizeLimit" $c.persistence.enabled) $volMiB) -}}
{{- end -}}
{{- end -}}
{{- end -}}
