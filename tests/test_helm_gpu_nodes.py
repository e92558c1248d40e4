"""The DaemonSet's default GPU-node placement on the clusters people have: managed GPU clouds (GKE, EKS with
node groups, Karpenter or Auto Mode, AKS), NVIDIA's and AMD's GPU operators and node feature discovery.

Each cloud is a set of node label sets, GPU and CPU nodes, as that cloud labels them; the chart's rendered
affinity (helm v4) is evaluated against each with the scheduler's node selector term semantics
(tests/support/nodes.py). NOTES.txt counts the nodes the DaemonSet is scheduled on through `lookup`, here against
a fake API server listing those nodes, and says what to do when none matches.
"""

from __future__ import annotations

import pytest

from tests.support.helm import CHART, ROOT, install_notes, template, workload
from tests.support.nodes import expression_matches, notes_against, terms_match

pytestmark = pytest.mark.e2e  # every test here runs helm

# The labels each platform sets on its nodes by itself (beside kubernetes.io/*, which every node has).
LINUX = {"kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"}
CLOUDS: dict[str, dict[str, list[dict[str, str]]]] = {
    "gke": {
        "gpu": [
            {**LINUX, "cloud.google.com/gke-nodepool": "l4-pool", "cloud.google.com/gke-accelerator": "nvidia-l4",
             "cloud.google.com/machine-family": "g2", "node.kubernetes.io/instance-type": "g2-standard-8",
             "cloud.google.com/gke-gpu-driver-version": "default"},
            {**LINUX, "cloud.google.com/gke-nodepool": "h100-pool", "cloud.google.com/gke-accelerator": "nvidia-h100-80gb",
             "node.kubernetes.io/instance-type": "a3-highgpu-8g"},
        ],
        "cpu": [
            {**LINUX, "cloud.google.com/gke-nodepool": "default-pool", "cloud.google.com/machine-family": "e2",
             "node.kubernetes.io/instance-type": "e2-standard-4"},
            # A TPU node is no GPU node: it has its own accelerator label.
            {**LINUX, "cloud.google.com/gke-nodepool": "tpu-pool", "cloud.google.com/gke-tpu-accelerator": "tpu-v5-lite-podslice",
             "cloud.google.com/gke-tpu-topology": "2x4", "node.kubernetes.io/instance-type": "ct5lp-hightpu-4t"},
        ],
    },
    "eks-node-group": {
        "gpu": [
            {**LINUX, "eks.amazonaws.com/nodegroup": "gpu", "eks.amazonaws.com/capacityType": "ON_DEMAND",
             "k8s.amazonaws.com/accelerator": "nvidia-a10g", "node.kubernetes.io/instance-type": "g5.12xlarge"},
        ],
        "cpu": [
            {**LINUX, "eks.amazonaws.com/nodegroup": "system", "eks.amazonaws.com/capacityType": "ON_DEMAND",
             "node.kubernetes.io/instance-type": "m6i.xlarge"},
        ],
    },
    "eks-karpenter": {
        "gpu": [
            {**LINUX, "karpenter.sh/nodepool": "gpu", "karpenter.sh/capacity-type": "on-demand",
             "karpenter.k8s.aws/instance-family": "p5", "karpenter.k8s.aws/instance-gpu-count": "8",
             "karpenter.k8s.aws/instance-gpu-manufacturer": "nvidia", "karpenter.k8s.aws/instance-gpu-name": "h100",
             "node.kubernetes.io/instance-type": "p5.48xlarge"},
        ],
        "cpu": [
            {**LINUX, "karpenter.sh/nodepool": "default", "karpenter.sh/capacity-type": "spot",
             "karpenter.k8s.aws/instance-family": "m7i", "karpenter.k8s.aws/instance-cpu": "16",
             "node.kubernetes.io/instance-type": "m7i.4xlarge"},
            # Should a count of 0 ever be written, it is still no GPU node (Gt 0, not Exists).
            {**LINUX, "karpenter.sh/nodepool": "default", "karpenter.k8s.aws/instance-gpu-count": "0"},
        ],
    },
    "eks-auto-mode": {
        "gpu": [
            {**LINUX, "eks.amazonaws.com/compute-type": "auto", "eks.amazonaws.com/instance-family": "g6",
             "eks.amazonaws.com/instance-gpu-count": "1", "eks.amazonaws.com/instance-gpu-manufacturer": "nvidia",
             "node.kubernetes.io/instance-type": "g6.2xlarge"},
        ],
        "cpu": [
            {**LINUX, "eks.amazonaws.com/compute-type": "auto", "eks.amazonaws.com/instance-family": "c6a",
             "node.kubernetes.io/instance-type": "c6a.large"},
        ],
    },
    "aks": {
        "gpu": [
            {**LINUX, "kubernetes.azure.com/agentpool": "gpunp", "kubernetes.azure.com/mode": "user",
             "kubernetes.azure.com/accelerator": "nvidia", "node.kubernetes.io/instance-type": "Standard_NC24ads_A100_v4"},
        ],
        "cpu": [
            {**LINUX, "kubernetes.azure.com/agentpool": "nodepool1", "kubernetes.azure.com/mode": "system",
             "node.kubernetes.io/instance-type": "Standard_D4s_v5"},
        ],
    },
    "nvidia-gpu-operator": {
        "gpu": [
            {**LINUX, "nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
             "feature.node.kubernetes.io/pci-10de.present": "true"},
        ],
        "cpu": [
            # NFD on a CPU server: its BMC's ASPEED VGA (1a03) is a display device, and no GPU.
            {**LINUX, "feature.node.kubernetes.io/pci-1a03.present": "true",
             "feature.node.kubernetes.io/cpu-model.vendor_id": "Intel"},
        ],
    },
    "nfd-only": {
        "gpu": [
            {**LINUX, "feature.node.kubernetes.io/pci-10de.present": "true"},
            {**LINUX, "feature.node.kubernetes.io/pci-1002.present": "true"},
        ],
        "cpu": [
            # An AMD EPYC server is no AMD GPU node (CPU vendor id 1022; its VGA is the BMC's).
            {**LINUX, "feature.node.kubernetes.io/cpu-model.vendor_id": "AMD",
             "feature.node.kubernetes.io/pci-1a03.present": "true"},
        ],
    },
    "amd-gpu-operator": {
        "gpu": [
            {**LINUX, "feature.node.kubernetes.io/amd-gpu": "true", "amd.com/gpu.family": "AI",
             "amd.com/gpu.device-id": "74a1", "amd.com/gpu.product-name": "AMD_Instinct_MI300X_OAM"},
            # AMD's device plugin with its node labeller, without the operator's NFD rule.
            {**LINUX, "amd.com/gpu.family": "AI", "amd.com/gpu.device-id": "740f"},
        ],
        "cpu": [
            {**LINUX, "feature.node.kubernetes.io/cpu-model.vendor_id": "AMD"},
        ],
    },
}  # fmt: skip


def default_terms(values: dict | None = None) -> list[dict]:
    """The nodeSelectorTerms of the DaemonSet's required node affinity, as helm renders them."""
    spec = workload(template(values=values))["spec"]["template"]["spec"]
    return spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]


@pytest.mark.parametrize("cloud", sorted(CLOUDS))
def test_default_placement_matches_every_gpu_node_and_no_cpu_node(cloud):
    terms = default_terms()
    gpu, cpu = CLOUDS[cloud]["gpu"], CLOUDS[cloud]["cpu"]
    assert [terms_match(terms, labels) for labels in gpu] == [True] * len(gpu)
    assert [terms_match(terms, labels) for labels in cpu] == [False] * len(cpu)


def test_default_terms_are_the_documented_ones():
    keys = [(e["key"], e["operator"], e.get("values")) for t in default_terms() for e in t["matchExpressions"]]
    assert keys == [
        ("feature.node.kubernetes.io/amd-gpu", "In", ["true"]),
        ("nvidia.com/gpu.present", "In", ["true"]),
        ("kubernetes.azure.com/accelerator", "Exists", None),
        ("amd.com/gpu.family", "Exists", None),
        ("k8s.amazonaws.com/accelerator", "Exists", None),
        ("eks.amazonaws.com/instance-gpu-count", "Gt", ["0"]),
        ("cloud.google.com/gke-accelerator", "Exists", None),
        ("karpenter.k8s.aws/instance-gpu-count", "Gt", ["0"]),
        ("feature.node.kubernetes.io/pci-1002.present", "In", ["true"]),
        ("feature.node.kubernetes.io/pci-10de.present", "In", ["true"]),
    ]


def test_a_term_can_be_added_and_a_default_one_dropped_by_name():
    values = {"gpuNodes": {"nodeSelectorTerms": {
        "gke": None,
        "onPrem": [{"key": "pool", "operator": "In", "values": ["llm"]}, {"key": "gpus", "operator": "Gt", "values": ["3"]}],
    }}}  # fmt: skip
    terms = default_terms(values)
    assert len(terms) == 10
    assert not terms_match(terms, CLOUDS["gke"]["gpu"][0])
    assert terms_match(terms, {"pool": "llm", "gpus": "4"})
    assert not terms_match(terms, {"pool": "llm", "gpus": "2"})
    assert not terms_match(terms, {"pool": "llm"})


def test_every_term_null_fails_with_a_message():
    values = {"gpuNodes": {"nodeLabels": {"nvidia.com/gpu.present": None, "feature.node.kubernetes.io/amd-gpu": None},
                           "nodeSelectorTerms": dict.fromkeys(
                               ["gke", "eksAccelerator", "karpenter", "eksAutoMode", "aks", "nfdNvidia", "nfdAmd",
                                "amdNodeLabeller"])}}  # fmt: skip
    err = template(values=values, ok=False)
    assert "gpuNodes: every node label and node selector term is null" in err


@pytest.mark.parametrize(
    ("expr", "labels", "want"),
    [
        ({"key": "a", "operator": "In", "values": ["x", "y"]}, {"a": "y"}, True),
        ({"key": "a", "operator": "In", "values": ["x"]}, {}, False),
        ({"key": "a", "operator": "NotIn", "values": ["x"]}, {}, True),
        ({"key": "a", "operator": "NotIn", "values": ["x"]}, {"a": "x"}, False),
        ({"key": "a", "operator": "Exists"}, {"a": ""}, True),
        ({"key": "a", "operator": "DoesNotExist"}, {"a": ""}, False),
        ({"key": "a", "operator": "Gt", "values": ["0"]}, {"a": "8"}, True),
        ({"key": "a", "operator": "Gt", "values": ["0"]}, {"a": "0"}, False),
        ({"key": "a", "operator": "Gt", "values": ["0"]}, {"a": "many"}, False),
        ({"key": "a", "operator": "Lt", "values": ["4"]}, {"a": "-1"}, True),
        ({"key": "a", "operator": "Lt", "values": ["4"]}, {}, False),
    ],
)
def test_the_matcher_follows_the_scheduler(expr, labels, want):
    assert expression_matches(expr, labels) is want


def test_an_empty_term_matches_nothing():
    assert terms_match([{"matchExpressions": []}], {"a": "b"}) is False
    assert terms_match([], {"a": "b"}) is False


# ---------------------------------------------------------------------------------------------- NOTES.txt


def test_notes_count_the_gpu_nodes_of_a_mixed_cluster(tmp_path):
    nodes = [
        labels for cloud in ("gke", "eks-karpenter", "aks") for kind in ("gpu", "cpu") for labels in CLOUDS[cloud][kind]
    ]
    want = sum(terms_match(default_terms(), labels) for labels in nodes)
    assert (want, len(nodes)) == (4, 9)
    notes = notes_against(nodes, tmp_path)
    assert "The DaemonSet is scheduled on 4 of the cluster's 9 nodes (those with a GPU-node label)." in notes
    assert "WARNING: the DaemonSet is scheduled on 0" not in notes


def test_notes_count_with_every_operator_as_the_matcher_does(tmp_path):
    # The template's own matcher against the Python one, over terms that use every operator.
    values = {"gpuNodes": {"nodeLabels": None, "nodeSelectorTerms": {
        "a": [{"key": "gpus", "operator": "Gt", "values": ["1"]}, {"key": "gpus", "operator": "Lt", "values": ["8"]}],
        "b": [{"key": "pool", "operator": "NotIn", "values": ["cpu"]}, {"key": "tpu", "operator": "DoesNotExist"},
              {"key": "zone", "operator": "Exists"}],
        "c": [{"key": "pool", "operator": "In", "values": ["x", "llm"]}],
        "gke": None, "eksAccelerator": None, "karpenter": None, "eksAutoMode": None, "aks": None, "nfdNvidia": None,
        "nfdAmd": None, "amdNodeLabeller": None,
    }}}  # fmt: skip
    nodes = [
        {"gpus": "4"},
        {"gpus": "8"},
        {"gpus": "x"},
        {"pool": "cpu", "zone": "a"},
        {"pool": "gpu", "zone": "a"},
        {"zone": "a", "tpu": "v5"},
        {"zone": "b"},
        {"pool": "llm"},
        {},
    ]
    terms = default_terms(values)
    assert [terms_match(terms, n) for n in nodes] == [True, False, False, False, True, False, True, True, False]
    assert "The DaemonSet is scheduled on 4 of the cluster's 9 nodes" in notes_against(nodes, tmp_path, values)


def test_notes_count_honours_the_node_selector(tmp_path):
    nodes = CLOUDS["gke"]["gpu"]
    notes = notes_against(nodes, tmp_path, {"nodeSelector": {"cloud.google.com/gke-nodepool": "h100-pool"}})
    assert "The DaemonSet is scheduled on 1 of the cluster's 2 nodes" in notes


def test_notes_warn_and_say_what_to_do_when_no_node_matches(tmp_path):
    nodes = [labels for cloud in CLOUDS.values() for labels in cloud["cpu"]]
    notes = notes_against(nodes, tmp_path)
    assert f"WARNING: the DaemonSet is scheduled on 0 of the cluster's {len(nodes)} nodes" in notes
    assert "kubectl label node <node> nvidia.com/gpu.present=true" in notes
    assert "--set gpuNodes.nodeLabels.<label>=<value>" in notes
    assert "--set gpuNodes.enabled=false" in notes


def test_notes_say_they_could_not_count_without_a_cluster():
    notes = install_notes()
    assert "Could not count the nodes it is scheduled on: no cluster answered" in notes
    assert "kubectl -n monitoring get daemonset t-sglang-oom-exporter" in notes
    assert "Could not count" not in install_notes(values={"gpuNodes": {"enabled": False}})


def test_docs_name_every_default_gpu_label():
    readme = (CHART / "README.md").read_text()
    kubernetes = (ROOT / "docs" / "kubernetes.md").read_text()
    keys = [e["key"] for t in default_terms() for e in t["matchExpressions"]]
    assert [k for k in keys if f"`{k}" not in readme] == []
    assert [k for k in keys if k.split("/")[-1] not in kubernetes] == []
    for cloud in ("GKE", "EKS", "AKS"):
        assert cloud in readme
        assert cloud in kubernetes


def test_the_old_placement_is_one_value_away():
    # The chart README's "Upgrades" says so: nodeSelectorTerms null leaves the two nodeLabels terms.
    terms = default_terms({"gpuNodes": {"nodeSelectorTerms": None}})
    assert [t["matchExpressions"][0]["key"] for t in terms] == [
        "feature.node.kubernetes.io/amd-gpu",
        "nvidia.com/gpu.present",
    ]
