"""A process kubelet: the node agent that stands in for containerd (and only for it) under a real
Kubernetes control plane (tools/controlplane), so the chart's pods run as local processes.

- kubelet.py    ProcessKubelet: registers the Nodes, keeps them Ready, watches the pods bound to them,
                runs each in a PodWorker, serves their logs, loses a node on demand
- nodes.py      NodeSpec and the GPU/system node shapes the chart selects (instance type, GPU taint,
                nvidia.com/gpu and vpc.amazonaws.com/efa), Node status and Lease objects
- podworker.py  one pod's life: init containers, containers as process trees, restartPolicy, status,
                deletion with grace
- sandbox.py    a pod's folders and volumes (emptyDir, hostPath, PVC, configMap, secret, downwardAPI,
                projected service account token) and the mount map that rewrites paths to them
- env.py        env and command line as the kubelet computes them ($(VAR), downward API), cluster DNS
                names rewritten to 127.0.0.1
- status.py     container states and pod status as the API's JSON
- image.py      the image every container runs: this checkout and its virtualenv
- logserver.py  the HTTPS endpoint the API server proxies `pods/log` to
- api.py        the API calls, on plain dicts
- __main__.py   `python -m tools.kubelet --kubeconfig FILE --gpu-nodes 3`: run it until interrupted

What it does not do: isolate pods (one network namespace, one filesystem: every pod is 127.0.0.1 and sees
its volumes through rewritten paths, sandbox.py), enforce resource limits or readOnly mounts, run
liveness probes, restart a sidecar (restartable init container: run, stopped after the main containers,
its exec startup probe awaited), pull images, or serve exec/attach/port-forward.
"""
