{{/*
The workload's name (Job or JobSet): the full name plus a digest of everything in its spec except
`suspend`. The API server refuses to change a Job's pod template, selector, completion mode, failure
policy or per-index backoff in place (docs/infra.md, "Redeploys"), and `helm upgrade` patches an object
that keeps its name. So a change of image or values gives the workload a new name: Helm creates the
new one and deletes the old one (propagation Background: its pods get SIGTERM), and the run resumes
from its last checkpoint (runName, and so its directories, stay the same). For a Job, `suspend` is left
out of the digest: flipping it starts or stops the same Job in place. The JobSet carries `suspend` inside
its replicated Job's template, which the JobSet webhook may refuse to change: there it stays in the digest
(a flip replaces the JobSet).

*/}}
{{- define "trainer.workloadName" -}}
{{- $failure := include "trainer.jobFailureSpec" . }}
{{- if eq .Values.workload "job" }}
{{- $failure = regexReplaceAll "(?m)^suspend: .*$" $failure "" }}
{{- end }}
{{- $spec := printf "%s\n%s\n%s" .Values.workload $failure (include "trainer.podTemplate" .) }}
{{- printf "%s-%s" (include "trainer.fullname" .) (sha256sum $spec | trunc 6) }}
{{- end }}
