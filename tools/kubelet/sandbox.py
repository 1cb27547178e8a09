"""A pod's sandbox on this host: its folder, its volumes as local folders, and the mount map that turns
a path inside the container into the folder that holds it here.

    <node root>/pods/<namespace>_<name>_<uid>/
        volumes/<volume>/       emptyDir (medium Memory too: the pod's own /dev/shm is one of these),
                                configMap, secret, downwardAPI, projected (files written at start)
        logs/<container>/<restart>.log
    <node root>/host/<path>     hostPath volumes: the node's own disk (a node-local NVMe folder survives
                                the pod, and dies with the node)
    <storage root>/<path>       a PersistentVolumeClaim's bound volume (`hostPath`, `local` or `nfs`
                                path): network storage every node mounts, one folder here for all nodes

An emptyDir is named through `/tmp/pk-<uid>` (a link to the pod's volumes/), so that a Unix socket in it
(the node-health sidecar's) has a path within the 107 bytes a socket address holds.

No mount namespace is made (it needs root): a process sees this host's filesystem, and every path under
a mountPath in its env, arguments or working directory is rewritten to the local folder instead
(`MountMap.rewrite`). A program that reaches a mounted path without naming it (a default compiled in)
misses the volume: give it the path as an argument or an env value. readOnly is not enforced.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tools.kubelet.env import EnvError, field_value

#: Reads what a volume needs from the API: (kind, namespace, name) -> object dict or None.
ObjectReader = Callable[[str, str, str], Mapping[str, Any] | None]
#: Issues a service account token: (namespace, service account, audience, seconds) -> token.
TokenIssuer = Callable[[str, str, str | None, int], str]


class VolumeError(RuntimeError):
    """A volume cannot be set up (what the kubelet reports as FailedMount)."""


@dataclass(frozen=True)
class MountMap:
    """Container paths -> local folders, longest mountPath first."""

    mounts: tuple[tuple[str, Path], ...]

    @classmethod
    def of(cls, pairs: Sequence[tuple[str, Path]]) -> MountMap:
        cleaned = [(p.rstrip("/") or "/", local) for p, local in pairs]
        return cls(tuple(sorted(cleaned, key=lambda pair: -len(pair[0]))))

    def rewrite(self, text: str) -> str:
        """Every path in `text` under a mountPath, at the start or after `=`, `:`, a space or a quote,
        with the mountPath replaced by its local folder. One pass: a local folder put in is never
        rewritten again (it may itself lie under a mountPath such as /tmp)."""
        if not self.mounts:
            return text
        local = dict(self.mounts)
        alternatives = "|".join(re.escape(path) for path, _ in self.mounts)  # longest first
        pattern = re.compile(r"(?:^|(?<=[=:\s'\"]))(" + alternatives + r")(?=/|$|[\s'\":;,])")
        return pattern.sub(lambda m: str(local[m.group(1)]), text)


@dataclass
class PodSandbox:
    """The folders of one pod on one node."""

    root: Path
    node_root: Path
    storage_root: Path

    @property
    def volumes_dir(self) -> Path:
        return self.root / "volumes"

    @property
    def short_volumes_dir(self) -> Path:
        """A short link to volumes_dir, named by the pod's uid (the last part of the root's name)."""
        return Path(tempfile.gettempdir()) / f"pk-{self.root.name.rsplit('_', 1)[-1]}"

    def remove_short_link(self) -> None:
        with contextlib.suppress(OSError):
            if self.short_volumes_dir.is_symlink():
                self.short_volumes_dir.unlink()

    def log_path(self, container: str, restart: int) -> Path:
        return self.root / "logs" / container / f"{restart}.log"

    def remove(self) -> None:
        self.remove_short_link()
        shutil.rmtree(self.root, ignore_errors=True)

    def _short(self, folder: Path) -> Path:
        link = self.short_volumes_dir
        if not link.is_symlink():
            link.symlink_to(self.volumes_dir, target_is_directory=True)
        return link / folder.name

    def set_up(
        self,
        pod: Mapping[str, Any],
        *,
        read_object: ObjectReader,
        issue_token: TokenIssuer,
        host_ip: str,
        pod_ip: str,
    ) -> dict[str, Path]:
        """Create every volume of `pod`; returns volume name -> local folder."""
        namespace = pod["metadata"]["namespace"]
        folders: dict[str, Path] = {}
        for volume in (pod.get("spec") or {}).get("volumes") or []:
            name = volume["name"]
            own = self.volumes_dir / name
            if "emptyDir" in volume:
                own.mkdir(parents=True, exist_ok=True)
                folders[name] = self._short(own)
            elif "hostPath" in volume:
                folders[name] = self._host_path(volume["hostPath"], name)
            elif "persistentVolumeClaim" in volume:
                folders[name] = self._claim(
                    namespace, volume["persistentVolumeClaim"]["claimName"], read_object
                )
            elif "configMap" in volume or "secret" in volume:
                kind, ref = (
                    ("configmap", volume["configMap"])
                    if "configMap" in volume
                    else ("secret", volume["secret"])
                )
                ref_name = ref.get("name") or ref.get("secretName", "")
                data = _data(read_object(kind, namespace, ref_name), kind)
                if data is None and not ref.get("optional"):
                    raise VolumeError(f"volume {name}: {kind} {ref_name!r} not found")
                _write_items(own, data or {}, ref.get("items"), ref.get("defaultMode"))
                folders[name] = own
            elif "downwardAPI" in volume:
                items = {
                    i["path"]: field_value(pod, i["fieldRef"]["fieldPath"], host_ip, pod_ip)
                    for i in volume["downwardAPI"].get("items") or []
                    if "fieldRef" in i
                }
                _write_items(own, items, None, volume["downwardAPI"].get("defaultMode"))
                folders[name] = own
            elif "projected" in volume:
                self._projected(pod, volume["projected"], own, read_object, issue_token, host_ip, pod_ip)
                folders[name] = own
            else:
                raise VolumeError(f"volume {name}: its kind is not one this node can mount")
        return folders

    def _host_path(self, source: Mapping[str, Any], name: str) -> Path:
        local = self.node_root / "host" / source["path"].lstrip("/")
        kind = source.get("type") or ""
        if kind in ("Directory", "File", "Socket", "CharDevice", "BlockDevice") and not local.exists():
            raise VolumeError(f"volume {name}: hostPath {source['path']} ({kind}) does not exist on the node")
        if kind in ("", "DirectoryOrCreate"):
            local.mkdir(parents=True, exist_ok=True)
        return local

    def _claim(self, namespace: str, claim: str, read_object: ObjectReader) -> Path:
        pvc = read_object("persistentvolumeclaim", namespace, claim)
        volume_name = ((pvc or {}).get("spec") or {}).get("volumeName")
        if not volume_name:
            raise VolumeError(f"persistentVolumeClaim {claim!r} is not bound to a volume")
        pv = read_object("persistentvolume", "", volume_name) or {}
        spec = pv.get("spec") or {}
        path = next((spec[k]["path"] for k in ("hostPath", "local", "nfs") if k in spec), None)
        if path is None:
            raise VolumeError(f"persistentVolume {volume_name!r}: no hostPath, local or nfs path to map here")
        local = self.storage_root / path.lstrip("/")
        local.mkdir(parents=True, exist_ok=True)
        return local

    def _projected(
        self,
        pod: Mapping[str, Any],
        projected: Mapping[str, Any],
        own: Path,
        read_object: ObjectReader,
        issue_token: TokenIssuer,
        host_ip: str,
        pod_ip: str,
    ) -> None:
        namespace = pod["metadata"]["namespace"]
        mode = projected.get("defaultMode")
        for source in projected.get("sources") or []:
            if "serviceAccountToken" in source:
                token = source["serviceAccountToken"]
                account = (pod.get("spec") or {}).get("serviceAccountName") or "default"
                text = issue_token(
                    namespace, account, token.get("audience"), int(token.get("expirationSeconds", 3607))
                )
                _write_items(own, {token["path"]: text}, None, mode)
            elif "configMap" in source or "secret" in source:
                kind, ref = (
                    ("configmap", source["configMap"])
                    if "configMap" in source
                    else ("secret", source["secret"])
                )
                data = _data(read_object(kind, namespace, ref["name"]), kind)
                if data is None and not ref.get("optional"):
                    raise VolumeError(f"projected volume: {kind} {ref['name']!r} not found")
                _write_items(own, data or {}, ref.get("items"), mode)
            elif "downwardAPI" in source:
                items = {
                    i["path"]: field_value(pod, i["fieldRef"]["fieldPath"], host_ip, pod_ip)
                    for i in source["downwardAPI"].get("items") or []
                    if "fieldRef" in i
                }
                _write_items(own, items, None, mode)


def mount_map(container: Mapping[str, Any], folders: Mapping[str, Path]) -> MountMap:
    """The container's volumeMounts (subPath included) as a MountMap."""
    pairs = []
    for mount in container.get("volumeMounts") or []:
        if mount["name"] not in folders:
            raise EnvError(f"volumeMount {mount['name']!r}: no such volume in the pod")
        local = folders[mount["name"]]
        if mount.get("subPath"):
            local = local / mount["subPath"]
            local.mkdir(parents=True, exist_ok=True)
        pairs.append((mount["mountPath"], local))
    return MountMap.of(pairs)


def _data(obj: Mapping[str, Any] | None, kind: str) -> dict[str, str] | None:
    if obj is None:
        return None
    import base64

    if kind == "secret":
        raw = {k: base64.b64decode(v).decode("utf-8", "replace") for k, v in (obj.get("data") or {}).items()}
        return {**raw, **(obj.get("stringData") or {})}
    return {**(obj.get("data") or {}), **{k: v for k, v in (obj.get("binaryData") or {}).items()}}


def _write_items(
    folder: Path, data: Mapping[str, str], items: Sequence[Mapping[str, Any]] | None, mode: int | None
) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    chosen = {i["path"]: data[i["key"]] for i in items if i["key"] in data} if items else dict(data)
    for rel, text in chosen.items():
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        if mode is not None:
            os.chmod(path, mode | 0o400)  # the kubelet itself (root there, not here) must still read it
