"""pid → container id and pod uid from /proc/<pid>/cgroup (agent.identity.containers): the file
contents each runtime and cgroup driver produce, as published with their versions, and this
machine's own files for processes placed in such cgroups. Pure Python except the last test
(root and a writable cgroup hierarchy)."""

from __future__ import annotations

import os
import subprocess

import pytest

from agent.identity import containers
from agent.identity.containers import ContainerRef
from tests.agent.cgroups import PodCgroup

# Real file contents. Sources: the cgroup tests of NeuVector (share/system/cgroup_test.go,
# github.com/neuvector/neuvector, commit 1b8b7075), each recorded on the runtime version it
# names; Linux's cgroup_namespaces(7) for the "../" form; kubelet's naming
# (pkg/kubelet/cm/cgroup_manager_linux.go: "kubepods-<qos>-pod<uid>.slice", "-" → "_").

# cgroup v1, cgroupfs driver, containerd 1.2.13 (NeuVector TestK8sContainerd_v1_2_13)
CONTAINERD_CGROUPFS_V1 = """\
11:pids:/kubepods/besteffort/poda36d0c1d-0b26-4451-8d80-9c195e004afa/5dd96d5394ca930a854a390ea46f7515a8bc930123eb3251ba20f2708a38fc61
10:perf_event:/kubepods/besteffort/poda36d0c1d-0b26-4451-8d80-9c195e004afa/5dd96d5394ca930a854a390ea46f7515a8bc930123eb3251ba20f2708a38fc61
9:memory:/kubepods/besteffort/poda36d0c1d-0b26-4451-8d80-9c195e004afa/5dd96d5394ca930a854a390ea46f7515a8bc930123eb3251ba20f2708a38fc61
8:cpu,cpuacct:/kubepods/besteffort/poda36d0c1d-0b26-4451-8d80-9c195e004afa/5dd96d5394ca930a854a390ea46f7515a8bc930123eb3251ba20f2708a38fc61
7:blkio:/kubepods/besteffort/poda36d0c1d-0b26-4451-8d80-9c195e004afa/5dd96d5394ca930a854a390ea46f7515a8bc930123eb3251ba20f2708a38fc61
6:cpuset:/kubepods/besteffort/poda36d0c1d-0b26-4451-8d80-9c195e004afa/5dd96d5394ca930a854a390ea46f7515a8bc930123eb3251ba20f2708a38fc61
5:hugetlb:/kubepods/besteffort/poda36d0c1d-0b26-4451-8d80-9c195e004afa/5dd96d5394ca930a854a390ea46f7515a8bc930123eb3251ba20f2708a38fc61
4:devices:/kubepods/besteffort/poda36d0c1d-0b26-4451-8d80-9c195e004afa/5dd96d5394ca930a854a390ea46f7515a8bc930123eb3251ba20f2708a38fc61
3:freezer:/kubepods/besteffort/poda36d0c1d-0b26-4451-8d80-9c195e004afa/5dd96d5394ca930a854a390ea46f7515a8bc930123eb3251ba20f2708a38fc61
2:net_cls,net_prio:/kubepods/besteffort/poda36d0c1d-0b26-4451-8d80-9c195e004afa/5dd96d5394ca930a854a390ea46f7515a8bc930123eb3251ba20f2708a38fc61
1:name=systemd:/kubepods/besteffort/poda36d0c1d-0b26-4451-8d80-9c195e004afa/5dd96d5394ca930a854a390ea46f7515a8bc930123eb3251ba20f2708a38fc61
"""

# cgroup v1, systemd driver, containerd on Bottlerocket (NeuVector TestK8sBottleRocket; its
# v2 line is the hybrid hierarchy's)
CONTAINERD_SYSTEMD_HYBRID = """\
11:cpuset:/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-poddd1bf9d1_241d_47f5_8e25_12de83135812.slice/cri-containerd-f45298cd514d1930c4fe3afc4412e59547f7e3148fddd22ca33cefce046eb830.scope
5:memory:/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-poddd1bf9d1_241d_47f5_8e25_12de83135812.slice/cri-containerd-f45298cd514d1930c4fe3afc4412e59547f7e3148fddd22ca33cefce046eb830.scope
1:name=systemd:/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-poddd1bf9d1_241d_47f5_8e25_12de83135812.slice/cri-containerd-f45298cd514d1930c4fe3afc4412e59547f7e3148fddd22ca33cefce046eb830.scope
0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-poddd1bf9d1_241d_47f5_8e25_12de83135812.slice/cri-containerd-f45298cd514d1930c4fe3afc4412e59547f7e3148fddd22ca33cefce046eb830.scope
"""

# cgroup v2, systemd driver, containerd 1.6.4, Kubernetes 1.24 (NeuVector
# TestContainerd_Container_Cgroupv2)
CONTAINERD_SYSTEMD_V2 = """\
0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod9493223b_520e_4a97_a45f_359dcf967006.slice/cri-containerd-25d057a4c6c9555f2a0eb106e8896968c28f1c44aca4754174851aca7f89ad26.scope
"""

# cgroup v1, containerd 1.4.4 with cgroupfs under a systemd-style cgroups path: one
# directory "<pod slice>:cri-containerd:<id>" (NeuVector TestK8sContainerd_v1_4_4)
CONTAINERD_COLON_V1 = """\
11:pids:/system.slice/containerd.service/kubepods-besteffort-pod2105e389_7471_476e_a50f_6074cef29bbd.slice:cri-containerd:d3d8ccf5cca91931c6285c1d7472c413dd5a7700fddc0aa9f89a9ac7008b003e
10:freezer:/kubepods-besteffort-pod2105e389_7471_476e_a50f_6074cef29bbd.slice:cri-containerd:d3d8ccf5cca91931c6285c1d7472c413dd5a7700fddc0aa9f89a9ac7008b003e
1:name=systemd:/system.slice/containerd.service/kubepods-besteffort-pod2105e389_7471_476e_a50f_6074cef29bbd.slice:cri-containerd:d3d8ccf5cca91931c6285c1d7472c413dd5a7700fddc0aa9f89a9ac7008b003e
"""

# cgroup v1, systemd driver, CRI-O 1.19 on OpenShift 4.6 (NeuVector TestK8sCrio_v1_19)
CRIO_SYSTEMD_V1 = """\
12:devices:/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod8ca306fa_3c03_47fa_97dd_19979c345572.slice/crio-d6d725b909f37c3e232aadfbafa950a58bfe7baa579ba8c47a12be88bb921607.scope
11:pids:/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod8ca306fa_3c03_47fa_97dd_19979c345572.slice/crio-d6d725b909f37c3e232aadfbafa950a58bfe7baa579ba8c47a12be88bb921607.scope
1:name=systemd:/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod8ca306fa_3c03_47fa_97dd_19979c345572.slice/crio-d6d725b909f37c3e232aadfbafa950a58bfe7baa579ba8c47a12be88bb921607.scope
"""

# cgroup v1, CRI-O 1.17 (OpenShift 4.4): a static pod, whose uid is its manifest hash
# (NeuVector TestK8sCrio_v1_17)
CRIO_STATIC_POD_V1 = """\
12:hugetlb:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod487a0dc6dccaeefbcfedba7a7ce1ca18.slice/crio-7a1fd6fe8cdfbd44dc78c4cc85dad7031eaab4365801684cad0aabdeaf863f9e.scope
1:name=systemd:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod487a0dc6dccaeefbcfedba7a7ce1ca18.slice/crio-7a1fd6fe8cdfbd44dc78c4cc85dad7031eaab4365801684cad0aabdeaf863f9e.scope
"""

# cgroup v2, CRI-O, Burstable (NeuVector TestCrio_Container_Cgroupv2)
CRIO_SYSTEMD_V2 = """\
0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod042efd86_1f3b_4f2f_8736_f31c58e95bbc.slice/crio-f33f47b0db740bb647cb3e7ac62d96c74966dbb99cbfaf4563bfd42d387e8b44.scope
"""

# CRI-O's monitor process sits in crio-conmon-<id>.scope beside the container: not the
# container (the path as Kubernetes' node e2e CPU-manager test gives it in a comment)
CRIO_CONMON_V2 = """\
0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0b7632a2_a56e_4278_987a_22de18008dbe.slice/crio-conmon-0bc5eac79e3ae7a0c2651f14722aa10fa333eb2325c2ca97da33aa284cda81b0.scope
"""

# cgroup v1, dockershim with the systemd driver (NeuVector TestDockerIDKubepods2)
DOCKERSHIM_SYSTEMD_V1 = """\
11:cpuset:/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod045b1e35_7f13_11e7_ac42_0050568ffca0.slice/docker-b5b6f2da8008be266864f896f93789762b2ce50792114a5c5f2cc3315af0bc70.scope
1:name=systemd:/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod045b1e35_7f13_11e7_ac42_0050568ffca0.slice/docker-b5b6f2da8008be266864f896f93789762b2ce50792114a5c5f2cc3315af0bc70.scope
"""

# cgroup v1: kube-proxy in a sub-cgroup of its container (NeuVector TestK8sProxyProcess)
SUBCGROUP_V1 = """\
11:freezer:/kubepods/besteffort/podf8a694f2-7c08-11e9-98da-000c29077430/c04e0a88a1de067f25bece337d4dbb897396e0b623c2a65330850fc9823f1903/kube-proxy
1:name=systemd:/kubepods/besteffort/podf8a694f2-7c08-11e9-98da-000c29077430/c04e0a88a1de067f25bece337d4dbb897396e0b623c2a65330850fc9823f1903/kube-proxy
"""

# cgroup v2 read from a private cgroup namespace (Docker 20.10.7, Ubuntu 21.10; NeuVector
# TestDockerK8s_Ubuntu_Container_Cgroupv2): "../" climbs out of the reader's own cgroup
PRIVATE_NS_V2 = """\
0::/../../kubepods-besteffort-podfd698699_eabf_4c23_92ef_cf0bbdb78261.slice/docker-2cc65c162ca1388b6b8d5ccfb701d22fc96675ccf8b2f1590c490c2c4039547f.scope
"""

# the same view of a sibling container (NeuVector TestDockerNative_Container_Cgroupv2):
# no pod level above it
PRIVATE_NS_SIBLING_V2 = """\
0::/../docker-1f1d6e2d4940ddac13abd421a2617992bf89f0e0f9a902ed58278c5f843e9ae7.scope
"""

# Docker outside Kubernetes: cgroupfs (Ubuntu), systemd (CentOS), nested (RancherOS's
# docker in docker) (NeuVector TestDockerIDUbuntu, TestDockerIDCentOS, TestDockerIDRancherOS)
DOCKER_CGROUPFS_V1 = """\
12:name=systemd:/docker/31cb02944da7a12196a193cf0e0f6c226d7c453a1db62e65ba98287593a2ee30
4:memory:/docker/31cb02944da7a12196a193cf0e0f6c226d7c453a1db62e65ba98287593a2ee30
1:cpuset:/docker/31cb02944da7a12196a193cf0e0f6c226d7c453a1db62e65ba98287593a2ee30
"""
DOCKER_SYSTEMD_V1 = """\
10:devices:/system.slice/docker-9ec39b91f3d70e1beff50a308f77067065ea6be0d91a3378375056cd4422cf3d.scope
1:name=systemd:/system.slice/docker-9ec39b91f3d70e1beff50a308f77067065ea6be0d91a3378375056cd4422cf3d.scope
"""
DOCKER_IN_DOCKER_V1 = """\
9:name=systemd:/docker/a9a5ad238e59234193ee7ec3fcff5e735b3708ea1068826952255b69e3cfa413/docker/ec08435e04266c5ba381fccbb829f626d11d8ddf5f8f547263c7a2d79ab4787a
8:memory:/docker/a9a5ad238e59234193ee7ec3fcff5e735b3708ea1068826952255b69e3cfa413/docker/ec08435e04266c5ba381fccbb829f626d11d8ddf5f8f547263c7a2d79ab4787a
"""

# Not in a container: a host process (NeuVector TestHostProcess), a login session
# (TestNsEnterProcess), a systemd service on cgroup v2
HOST_V1 = """\
13:name=systemd:/
12:pids:/
5:memory:/
1:cpuset:/
"""
SESSION_V1 = """\
13:name=systemd:/user/1000.user/c2.session
12:pids:/
2:cpu:/user/1000.user/c2.session
"""
SERVICE_V2 = "0::/system.slice/containerd.service\n"

CASES: list[tuple[str, str, ContainerRef | None]] = [
    (
        "containerd-cgroupfs-v1",
        CONTAINERD_CGROUPFS_V1,
        ContainerRef(
            "5dd96d5394ca930a854a390ea46f7515a8bc930123eb3251ba20f2708a38fc61",
            "a36d0c1d-0b26-4451-8d80-9c195e004afa",
        ),
    ),
    (
        "containerd-systemd-hybrid",
        CONTAINERD_SYSTEMD_HYBRID,
        ContainerRef(
            "f45298cd514d1930c4fe3afc4412e59547f7e3148fddd22ca33cefce046eb830",
            "dd1bf9d1-241d-47f5-8e25-12de83135812",
        ),
    ),
    (
        "containerd-systemd-v2",
        CONTAINERD_SYSTEMD_V2,
        ContainerRef(
            "25d057a4c6c9555f2a0eb106e8896968c28f1c44aca4754174851aca7f89ad26",
            "9493223b-520e-4a97-a45f-359dcf967006",
        ),
    ),
    (
        "containerd-colon-v1",
        CONTAINERD_COLON_V1,
        ContainerRef(
            "d3d8ccf5cca91931c6285c1d7472c413dd5a7700fddc0aa9f89a9ac7008b003e",
            "2105e389-7471-476e-a50f-6074cef29bbd",
        ),
    ),
    (
        "crio-systemd-v1",
        CRIO_SYSTEMD_V1,
        ContainerRef(
            "d6d725b909f37c3e232aadfbafa950a58bfe7baa579ba8c47a12be88bb921607",
            "8ca306fa-3c03-47fa-97dd-19979c345572",
        ),
    ),
    (
        "crio-static-pod-v1",
        CRIO_STATIC_POD_V1,
        ContainerRef(
            "7a1fd6fe8cdfbd44dc78c4cc85dad7031eaab4365801684cad0aabdeaf863f9e",
            "487a0dc6dccaeefbcfedba7a7ce1ca18",
        ),
    ),
    (
        "crio-systemd-v2",
        CRIO_SYSTEMD_V2,
        ContainerRef(
            "f33f47b0db740bb647cb3e7ac62d96c74966dbb99cbfaf4563bfd42d387e8b44",
            "042efd86-1f3b-4f2f-8736-f31c58e95bbc",
        ),
    ),
    ("crio-conmon-v2", CRIO_CONMON_V2, None),
    (
        "dockershim-systemd-v1",
        DOCKERSHIM_SYSTEMD_V1,
        ContainerRef(
            "b5b6f2da8008be266864f896f93789762b2ce50792114a5c5f2cc3315af0bc70",
            "045b1e35-7f13-11e7-ac42-0050568ffca0",
        ),
    ),
    (
        "subcgroup-v1",
        SUBCGROUP_V1,
        ContainerRef(
            "c04e0a88a1de067f25bece337d4dbb897396e0b623c2a65330850fc9823f1903",
            "f8a694f2-7c08-11e9-98da-000c29077430",
        ),
    ),
    (
        "private-ns-v2",
        PRIVATE_NS_V2,
        ContainerRef(
            "2cc65c162ca1388b6b8d5ccfb701d22fc96675ccf8b2f1590c490c2c4039547f",
            "fd698699-eabf-4c23-92ef-cf0bbdb78261",
        ),
    ),
    (
        "private-ns-sibling-v2",
        PRIVATE_NS_SIBLING_V2,
        ContainerRef("1f1d6e2d4940ddac13abd421a2617992bf89f0e0f9a902ed58278c5f843e9ae7", None),
    ),
    (
        "docker-cgroupfs-v1",
        DOCKER_CGROUPFS_V1,
        ContainerRef("31cb02944da7a12196a193cf0e0f6c226d7c453a1db62e65ba98287593a2ee30", None),
    ),
    (
        "docker-systemd-v1",
        DOCKER_SYSTEMD_V1,
        ContainerRef("9ec39b91f3d70e1beff50a308f77067065ea6be0d91a3378375056cd4422cf3d", None),
    ),
    (
        "docker-in-docker-v1",
        DOCKER_IN_DOCKER_V1,
        ContainerRef("ec08435e04266c5ba381fccbb829f626d11d8ddf5f8f547263c7a2d79ab4787a", None),
    ),
    ("host-v1", HOST_V1, None),
    ("session-v1", SESSION_V1, None),
    ("service-v2", SERVICE_V2, None),
]


@pytest.mark.parametrize(("text", "want"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_cgroup_file_formats(text: str, want: ContainerRef | None) -> None:
    assert containers.parse(text) == want


def test_kind_nested_pod_under_a_node_container() -> None:
    """Kubernetes in Docker (kind): the node is a Docker container and kind configures
    kubelet with ``cgroupDriver: systemd`` and ``cgroupRoot: /kubelet`` (its kubeadm
    config), so seen from the host a pod's path nests under the node's scope. Built from
    that layout (no published file of it at hand): the innermost container is the pod's, not
    the node's, and a Guaranteed pod's level has no QoS name."""
    node = "e" * 64
    cid = "0123456789abcdef" * 4
    text = (
        f"0::/system.slice/docker-{node}.scope/kubelet.slice/kubelet-kubepods.slice/"
        f"kubelet-kubepods-pod6f8c7e9a_0b1c_4d2e_9f3a_5b6c7d8e9f01.slice/"
        f"cri-containerd-{cid}.scope\n"
    )
    assert containers.parse(text) == ContainerRef(cid, "6f8c7e9a-0b1c-4d2e-9f3a-5b6c7d8e9f01")


def test_a_hybrid_host_prefers_the_hierarchy_that_names_the_pod() -> None:
    """This machine's layout (cgroup v1 controllers, a v2 hierarchy beside): one hierarchy
    may hold a process in a cgroup another does not, and a 32-digit id of a v1 controller's
    own grouping is no container."""
    cid = "a" * 64
    text = (
        "9:name=systemd:/\n"
        f"8:pids:/docker/{'b' * 64}\n"
        "4:memory:/process_api/9afc85d9ecbc73f3890888426ade7d19\n"
        f"0::/kubepods/burstable/pod11111111-2222-3333-4444-555555555555/{cid}\n"
    )
    assert containers.parse(text) == ContainerRef(cid, "11111111-2222-3333-4444-555555555555")


def test_lookalikes_are_not_containers() -> None:
    for path in (
        "0::/kubepods.slice/kubepods-burstable.slice",  # a QoS level: no pod, no container
        "0::/system.slice/docker.service",
        f"0::/user.slice/{'a' * 63}",  # 63 digits
        f"0::/user.slice/{'A' * 64}",  # ids are lowercase
        f"0::/user.slice/cri-containerd-{'a' * 64}.slice",
        "garbage without colons",
        "",
    ):
        assert containers.parse(path) is None, path


def test_a_process_placed_in_a_pod_cgroup_is_found() -> None:
    """The running kernel's own /proc/<pid>/cgroup for a process moved into a cgroup named
    as the systemd driver and containerd name a pod's container."""
    cg = PodCgroup()
    p = subprocess.Popen(["sleep", "30"])
    try:
        cg.add(p.pid)
        want = ContainerRef(cg.container_id, cg.pod_uid)
        assert containers.container_of(p.pid) == want
        assert containers.container_of(os.getpid()) != want
    finally:
        p.kill()
        p.wait()
        cg.remove()
