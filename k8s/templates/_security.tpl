{{/*
Hardening shared by every pod of the chart: the pod security contexts, the writable scratch
volume that lets every container run with a read-only root filesystem, the resources of the small
containers, and the init step that prepares the run's directories for a non-root trainer.
*/}}

{{/* The trainer pods' security context: RuntimeDefault seccomp always; the user only with runAsNonRoot. */}}
{{- define "trainer.podSecurityContext" -}}
seccompProfile:
  type: RuntimeDefault
{{- if .Values.runAsNonRoot }}
runAsNonRoot: true
runAsUser: {{ int .Values.runAsUser }}
runAsGroup: {{ int .Values.runAsGroup }}
fsGroup: {{ int .Values.runAsGroup }}
fsGroupChangePolicy: OnRootMismatch
{{- end }}
{{- end }}

{{/* The helm test pods run as runAsUser whatever the trainer runs as: they need no privilege. */}}
{{- define "trainer.testPodSecurityContext" -}}
seccompProfile:
  type: RuntimeDefault
runAsNonRoot: true
runAsUser: {{ int .Values.runAsUser }}
runAsGroup: {{ int .Values.runAsGroup }}
{{- end }}

{{- define "trainer.testContainerSecurityContext" -}}
privileged: false
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: [ALL]
{{- end }}

{{/*
The scratch emptyDir mounted at /tmp in every container, with HOME=/tmp (trainer.env): all that the
trainer's stack writes outside the mounted data paths lands here: Python's tempfiles, ft_launcher's and
NVRx's sockets, torch inductor's cache (/tmp/torchinductor_<user>), Triton's (~/.triton), CUDA's JIT
cache (~/.nv). tests/trainer/runtime/test_read_only_root.py runs the pod command on a read-only root to prove it.
*/}}
{{- define "trainer.scratchVolume" -}}
- name: scratch
  emptyDir:
    sizeLimit: {{ .Values.scratchSize | quote }}
{{- end }}

{{- define "trainer.scratchMount" -}}
- name: scratch
  mountPath: /tmp
{{- end }}

{{/* Requests and limits of the small containers (init steps, helm test pods). */}}
{{- define "trainer.helperResources" -}}
{{- toYaml .Values.helperResources }}
{{- end }}

{{/*
prepare-dirs (runAsNonRoot only): a fresh FSx root and the node's NVMe RAID are owned by root, and static
Lustre volumes ignore fsGroup, so a non-root trainer could not create its run's directories. This step
runs as root with only the capabilities it needs (CHOWN to hand the directories over, DAC_OVERRIDE and
FOWNER for directories an earlier run left owned by another user), creates the run's checkpoint, output
and local checkpoint directories and hands them to runAsUser:runAsGroup. The data directory is created
and handed over only when missing (an existing one belongs to whoever filled it).
*/}}
{{- define "trainer.prepareDirsContainer" -}}
- name: prepare-dirs
  image: {{ include "trainer.image" . | quote }}
  imagePullPolicy: {{ .Values.image.pullPolicy | quote }}
  command: [sh, -c]
  args:
    - |
      set -eu
      owner="$RUN_AS_USER:$RUN_AS_GROUP"
      for dir in "$CHECKPOINT_DIR" "$OUT_DIR" "$LOCAL_CHECKPOINT_DIR"; do
        mkdir -p "$dir"
        chown "$owner" "$dir"
      done
      data_dir=$(dirname "$DATA_PATH")
      if [ ! -d "$data_dir" ]; then
        mkdir -p "$data_dir"
        chown "$owner" "$data_dir"
      fi
  env:
    {{- include "trainer.env" . | nindent 4 }}
    - name: RUN_AS_USER
      value: {{ int .Values.runAsUser | quote }}
    - name: RUN_AS_GROUP
      value: {{ int .Values.runAsGroup | quote }}
  resources:
    {{- include "trainer.helperResources" . | nindent 4 }}
  securityContext:
    runAsNonRoot: false
    runAsUser: 0
    runAsGroup: 0
    privileged: false
    allowPrivilegeEscalation: false
    readOnlyRootFilesystem: true
    capabilities:
      drop: [ALL]
      add: [CHOWN, DAC_OVERRIDE, FOWNER]
  volumeMounts:
    - name: fsx
      mountPath: {{ .Values.storage.mountPath | quote }}
    - name: local-nvme
      mountPath: {{ include "trainer.localNvmeMount" . | quote }}
    {{- include "trainer.scratchMount" . | nindent 4 }}
{{- end }}
