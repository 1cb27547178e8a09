"""A real Kubernetes control plane on 127.0.0.1 for the tests and the cluster demo: etcd, kube-apiserver,
kube-controller-manager and kube-scheduler, built from their published source modules by `make
controlplane` (the wrapper Go module `controlplane/`, binaries in `.tools/controlplane/bin/`).

Read in this order:
- ``launch``: ``running_control_plane(workdir)``, a context manager that starts the four processes on free
  ports, waits until the API server is ready and the controllers work, yields a ``ControlPlane`` (server
  URL, admin kubeconfig, CA file, admin token) and stops every process on exit;
- ``pki``: the certificates and keys it needs, made with openssl (a CA, the API server's serving
  certificate, the service-account signing key, client certificates);
- ``flags``: each component's command line, with the reasons for the settings that differ from a
  component's defaults (the admission plugins EKS enables, the service CIDR, ...);
- ``processes``: one component as a process in its own process group, its log in the work folder, its
  readiness probe, and a stop that leaves no process behind;
- ``__main__``: ``python -m tools.controlplane up --dir D`` for people: prints the kubeconfig path, runs
  until SIGTERM or SIGINT.

What it is not: no kubelet (nodes and the pods' processes are the process kubelet's job), no kube-proxy,
no CNI, no cloud provider; NetworkPolicy objects are stored and never enforced.

May import: ``trainer.runtime.ports`` (free ports) and its own modules.
"""
