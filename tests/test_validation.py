"""Validation of the `Platform` schema: every bad config fails before any process starts, with a
`ConfigError` that names the key, the bad value and what to do instead.

Most tests call `Platform.validate` directly (no processes, no torch). `gpus_available`, where given,
mocks only the number of CUDA GPUs this machine reports (what `ddpw_runtime.launch.checks` asks torch for); it
does not mock CUDA itself, so these tests run the same on machines with and without GPUs. The last tests
go through the real Hydra path (`examples/train.py` in a subprocess) and check that nothing started.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, ValidationError

from ddpw_conf import ConfigError, Device, Platform, platform_from_config
from ddpw_conf.platform import MAX_WORLD_SIZE

REPO = Path(__file__).resolve().parents[1]
TRAIN = REPO / "examples" / "train.py"

_MISSING = object()


class Bad:
    """One bad config: the Platform fields, the key the error must name, the value it must show
    (defaults to the field's own value) and a piece of the fix text."""

    def __init__(
        self,
        id: str,
        fields: dict[str, Any],
        key: str,
        hint: str,
        value: Any = _MISSING,
        gpus_available: int | None = None,
    ) -> None:
        self.id = id
        self.fields = fields
        self.key = key
        self.hint = hint
        if value is _MISSING:
            value = fields[key.split(".", 1)[1].split("[", 1)[0]]
        self.value = value
        self.gpus_available = gpus_available


def _slurm(**fields: Any) -> dict[str, Any]:
    """Fields of a multi-node SLURM platform (one GPU per rank), where several nodes are allowed."""
    return {"device": "slurm", "n_gpus_per_node": 1, **fields}


BAD = [
    # --- wrong types (a plain dict reaches Platform without OmegaConf's type checks)
    Bad("n_nodes-str", {"n_nodes": "2"}, "platform.n_nodes", "integer >= 1"),
    Bad("n_nodes-float", {"n_nodes": 1.5}, "platform.n_nodes", "integer >= 1"),
    Bad("n_procs_per_node-bool", {"n_procs_per_node": True}, "platform.n_procs_per_node", "integer >= 1"),
    Bad("n_gpus_per_node-str-on-slurm", _slurm(n_gpus_per_node="1"), "platform.n_gpus_per_node", "integer >= 0"),
    Bad("name-int", {"name": 5}, "platform.name", "letters, digits"),
    Bad("master_port-str", {"master_port": "80"}, "platform.master_port", "1..65535"),
    Bad("master_port-a-string-in-range", {"master_port": "29500"}, "platform.master_port",  # (`${oc.env:...}`)
        "this is a string, not a number: write it unquoted (29500, not '29500')"),  # (it said only "use 1..65535")
    Bad("master_addr-int", {"master_addr": 5}, "platform.master_addr", "host name or IP"),
    Bad("ipc_groups-not-a-list", {"ipc_groups": 5}, "platform.ipc_groups", "list of lists of ranks"),
    Bad("ipc_groups-group-not-a-list", {"n_procs_per_node": 2, "ipc_groups": [0, 1]},
        "platform.ipc_groups[0]", "non-empty list of ranks", value=0),
    Bad("ipc_groups-rank-str", {"n_procs_per_node": 2, "ipc_groups": [["0", 1]]},
        "platform.ipc_groups[0]", "ranks are integers", value=["0", 1]),
    Bad("console_logs-str", {"console_logs": "no"}, "platform.console_logs", "true or false"),
    Bad("verbose-int", {"verbose": 2}, "platform.verbose", "true or false"),
    Bad("slurm_additional_parameters-list", {"slurm_additional_parameters": ["qos=high"]},
        "platform.slurm_additional_parameters", "mapping"),
    Bad("console_ranks-dict", {"console_ranks": {"0": 1}}, "platform.console_ranks", "'all' or a list"),
    # --- negative, zero and huge counts
    Bad("n_nodes-0", {"n_nodes": 0}, "platform.n_nodes", "integer >= 1"),
    Bad("n_nodes-negative", {"n_nodes": -1}, "platform.n_nodes", "integer >= 1"),
    Bad("n_procs_per_node-0", {"n_procs_per_node": 0}, "platform.n_procs_per_node", "integer >= 1"),
    Bad("n_procs_per_node-negative", {"n_procs_per_node": -4}, "platform.n_procs_per_node", "integer >= 1"),
    Bad("n_gpus_per_node-negative", {"n_gpus_per_node": -1}, "platform.n_gpus_per_node", "integer >= 0"),
    Bad("n_cpus_per_node-0", {"n_cpus_per_node": 0}, "platform.n_cpus_per_node", "integer >= 1"),
    Bad("n_cpus_per_node-a-string", {"n_cpus_per_node": "2"}, "platform.n_cpus_per_node",
        "this is a string, not a number: write it unquoted (2, not '2'), or decode a variable's value with oc.decode, "
        "such as ${oc.decode:${oc.env:MYCPUS}}"),
    Bad("timeout_min-a-string", {"timeout_min": "60"}, "platform.timeout_min",
        "positive number of minutes, such as 60 or 0.5; this is a string, not a number: write it unquoted"),
    Bad("mem_per_node-negative", {"mem_per_node": -1}, "platform.mem_per_node", "integer >= 0"),
    Bad("timeout_min-0", {"timeout_min": 0}, "platform.timeout_min", "positive number of minutes"),
    Bad("collective_timeout_min-neg", {"collective_timeout_min": -1}, "platform.collective_timeout_min",
        "positive number of minutes"),
    Bad("n_procs_per_node-huge", {"n_procs_per_node": 10**6}, "platform.n_procs_per_node", str(MAX_WORLD_SIZE)),
    Bad("n_nodes-huge", _slurm(n_nodes=10**5), "platform.n_nodes", str(MAX_WORLD_SIZE)),
    Bad("n_gpus_per_node-huge", {"device": "gpu", "n_gpus_per_node": 10**5}, "platform.n_gpus_per_node",
        str(MAX_WORLD_SIZE)),
    # --- process-group layout
    Bad("ipc_groups-overlap", {"n_procs_per_node": 2, "ipc_groups": [[0], [0, 1]]},
        "platform.ipc_groups", "must not overlap", value=[[0], [0, 1]]),
    Bad("ipc_groups-duplicate-in-group", {"n_procs_per_node": 2, "ipc_groups": [[0, 0], [1]]},
        "platform.ipc_groups[0]", "list each rank once", value=[0, 0]),
    Bad("ipc_groups-missing-rank", {"n_procs_per_node": 3, "ipc_groups": [[0], [1]]},
        "platform.ipc_groups", "rank(s) [2] are in no group", value=[[0], [1]]),
    Bad("ipc_groups-rank-outside-world", {"n_procs_per_node": 2, "ipc_groups": [[0, 1, 2]]},
        "platform.ipc_groups[0]", "outside the world of 2 rank(s)", value=[0, 1, 2]),
    Bad("ipc_groups-negative-rank", {"n_procs_per_node": 2, "ipc_groups": [[-1, 0, 1]]},
        "platform.ipc_groups[0]", "outside the world", value=[-1, 0, 1]),
    Bad("ipc_groups-empty-group", {"n_procs_per_node": 2, "ipc_groups": [[0, 1], []]},
        "platform.ipc_groups[1]", "non-empty list of ranks", value=[]),
    # --- resources per node
    Bad("n_cpus_per_node-not-divisible", {"n_procs_per_node": 4, "n_cpus_per_node": 6},
        "platform.n_cpus_per_node", "multiple of the 4 rank(s) per node"),
    Bad("n_procs_per_node-more-than-gpus", {"device": "gpu", "n_gpus_per_node": 2, "n_procs_per_node": 3},
        "platform.n_procs_per_node", "lower n_procs_per_node or raise n_gpus_per_node"),
    # --- choices
    Bad("device-unknown", {"device": "tpu"}, "platform.device", "cpu, gpu, mps, slurm"),
    Bad("device-int", {"device": 3}, "platform.device", "choose one of"),
    Bad("backend-unknown", {"backend": "ucc"}, "platform.backend", "gloo, nccl, mpi"),
    Bad("spawn_method-fork", {"spawn_method": "fork"}, "platform.spawn_method", "forkserver, spawn"),
    Bad("ipc_protocol-unknown", {"ipc_protocol": "udp"}, "platform.ipc_protocol", "tcp, file"),
    # --- devices and GPUs
    Bad("nccl-on-cpu", {"backend": "nccl"}, "platform.backend", "backend=gloo"),
    Bad("nccl-on-mps", {"device": "mps", "backend": "nccl"}, "platform.backend", "nccl needs CUDA GPUs"),
    Bad("nccl-without-cuda", {"device": "gpu", "n_gpus_per_node": 1, "backend": "nccl"},
        "platform.backend", "platform.device=cpu", gpus_available=0),
    Bad("gpu-without-cuda", {"device": "gpu", "n_gpus_per_node": 1},
        "platform.device", "platform.device=cpu", gpus_available=0),
    Bad("gpus-on-cpu", {"n_gpus_per_node": 2}, "platform.n_gpus_per_node", "device=cpu runs every rank on CPU and "
        "uses no GPU; set n_gpus_per_node=0"),  # (it ran one CPU rank)
    Bad("gpus-on-mps", {"device": "mps", "n_gpus_per_node": 1}, "platform.n_gpus_per_node", "device=mps runs every "
        "rank on MPS and uses no GPU"),
    Bad("gpu-with-0-gpus", {"device": "gpu", "n_gpus_per_node": 0}, "platform.n_gpus_per_node",
        "n_gpus_per_node >= 1 or use device=cpu"),
    Bad("more-gpus-than-present", {"device": "gpu", "n_gpus_per_node": 4}, "platform.n_gpus_per_node",
        "this machine has 2 CUDA GPU(s)", gpus_available=2),
    Bad("node_rank-2-of-2-nodes", {"n_nodes": 2, "node_rank": 2}, "platform.node_rank", "numbered 0..1"),
    Bad("join_timeout_min-0", {"join_timeout_min": 0}, "platform.join_timeout_min", "positive number of minutes"),
    Bad("n_nodes-2-on-mps", {"device": "mps", "n_nodes": 2}, "platform.n_nodes", "use n_nodes=1"),
    Bad("file-rendezvous-several-nodes", _slurm(n_nodes=2, ipc_protocol="file"), "platform.ipc_protocol",
        "use tcp"),
    # --- network
    Bad("master_port-0", {"master_port": 0}, "platform.master_port", "1..65535"),
    Bad("master_port-65536", {"master_port": 65536}, "platform.master_port", "1..65535"),
    Bad("master_port-negative", {"master_port": -80}, "platform.master_port", "1..65535"),
    Bad("master_addr-space", {"master_addr": "local host"}, "platform.master_addr", "host name or IP"),
    Bad("master_addr-newline", {"master_addr": "localhost\n"}, "platform.master_addr", "host name or IP"),
    Bad("master_addr-empty", {"master_addr": ""}, "platform.master_addr", "host name or IP"),
    # --- names that end up in sbatch scripts
    Bad("name-newline", {"name": "job\n#SBATCH --x"}, "platform.name", "letters, digits"),
    Bad("name-trailing-newline", {"name": "job\n"}, "platform.name", "letters, digits"),
    Bad("name-space", {"name": "my job"}, "platform.name", "letters, digits"),
    Bad("name-leading-dash", {"name": "-job"}, "platform.name", "starting with a letter or digit"),
    Bad("name-empty", {"name": ""}, "platform.name", "1-128"),
    Bad("name-too-long", {"name": "j" * 129}, "platform.name", "1-128"),
    Bad("partition-newline", {"partition": "gpu\n"}, "platform.partition", "SLURM partition name"),
    Bad("partition-space", {"partition": "gpu a100"}, "platform.partition", "SLURM partition name"),
    Bad("partition-leading-dash", {"partition": "--gpu"}, "platform.partition", "starting with a letter or digit"),
    Bad("slurm-param-value-newline", {"slurm_additional_parameters": {"qos": "high\n#SBATCH --x"}},
        "platform.slurm_additional_parameters.qos", "single-line", value="high\n#SBATCH --x"),
    Bad("slurm-param-value-carriage-return", {"slurm_additional_parameters": {"comment": "a\rb"}},
        "platform.slurm_additional_parameters.comment", "single-line", value="a\rb"),
    Bad("slurm-param-value-list", {"slurm_additional_parameters": {"gres": ["gpu:1"]}},
        "platform.slurm_additional_parameters.gres", "single-line strings or numbers", value=["gpu:1"]),
    Bad("slurm-param-key-wrap", {"slurm_additional_parameters": {"--wrap": "rm -rf ~"}},
        "platform.slurm_additional_parameters", "without dashes", value="--wrap"),
    Bad("slurm-param-key-space", {"slurm_additional_parameters": {"a b": 1}},
        "platform.slurm_additional_parameters", "sbatch option names", value="a b"),
    Bad("slurm-param-key-newline", {"slurm_additional_parameters": {"qos\n": "high"}},
        "platform.slurm_additional_parameters", "sbatch option names", value="qos\n"),
    # --- the rest
    Bad("upon_finish-not-import-path", {"upon_finish": "print('done')"}, "platform.upon_finish",
        "my_package.module:function"),
    Bad("upon_finish-space", {"upon_finish": "my module:fn"}, "platform.upon_finish", "import path"),
    Bad("upon_finish-newline", {"upon_finish": "pkg.mod:fn\n"}, "platform.upon_finish", "import path"),
    Bad("console_ranks-outside-world", {"n_procs_per_node": 2, "console_ranks": [0, 2]},
        "platform.console_ranks", "rank(s) [2] are outside the world of 2 rank(s)"),
    Bad("console_ranks-negative", {"console_ranks": [-1]}, "platform.console_ranks", "outside the world"),
    Bad("console_ranks-not-all", {"console_ranks": "everyone"}, "platform.console_ranks", "use 'all'"),
    Bad("console_ranks-str-rank", {"console_ranks": ["0"]}, "platform.console_ranks", "list of ranks"),
    Bad("seed-negative", {"seed": -1}, "platform.seed", "0..4294967295"),
    Bad("seed-2**32", {"seed": 2**32}, "platform.seed", "0..4294967295"),
    Bad("seed-float", {"seed": 1.5}, "platform.seed", "integer"),
    Bad("seed-a-string", {"seed": "42"}, "platform.seed", "this is a string, not a number: write it unquoted (42, "
        "not '42')"),
    # --- timeouts torch cannot count: below one millisecond, or past what its clocks hold
    Bad("collective_timeout_min-below-1ms", {"collective_timeout_min": 1e-9}, "platform.collective_timeout_min",
        "at least 0.0000167 minutes (1 ms)"),
    Bad("collective_timeout_min-1e13", {"collective_timeout_min": 1e13}, "platform.collective_timeout_min",
        "at most 52560000 minutes"),
    Bad("timeout_min-1e13", {"timeout_min": 1e13}, "platform.timeout_min", "at most 52560000 minutes"),
    Bad("timeout_min-inf", {"timeout_min": float("inf")}, "platform.timeout_min", "at most 52560000 minutes"),
    Bad("stall_timeout_min-0", {"stall_timeout_min": 0}, "platform.stall_timeout_min", "positive number of minutes"),
    Bad("stall_timeout_min-str", {"stall_timeout_min": "10"}, "platform.stall_timeout_min",
        "positive number of minutes"),
    Bad("exit_timeout_min-0", {"exit_timeout_min": 0}, "platform.exit_timeout_min", "positive number of minutes"),
    Bad("exit_timeout_min-str", {"exit_timeout_min": "soon"}, "platform.exit_timeout_min", "positive number"),
    Bad("stall_timeout_min-1e13", {"stall_timeout_min": 1e13}, "platform.stall_timeout_min", "at most 52560000"),
    Bad("stop_on_stall-without-stall_timeout_min", {"stop_on_stall": True}, "platform.stop_on_stall",
        "platform.stall_timeout_min set"),
    Bad("stop_on_stall-str", {"stop_on_stall": "yes", "stall_timeout_min": 5}, "platform.stop_on_stall",
        "use true or false"),
    # --- layout
    Bad("layout-unknown-axis", {"layout": {"expert": 2}}, "platform.layout.expert",
        "Layout has no such field; its fields are data, pipeline, tensor", value=2),
    Bad("layout-typo", {"layout": {"tensors": 2}}, "platform.layout.tensors", "did you mean tensor?", value=2),
    Bad("layout-not-a-mapping", {"layout": 2}, "platform.layout", "mapping such as {tensor: 2}"),
]


def _check(err: ConfigError, bad: Bad) -> None:
    message = str(err)
    assert err.key == bad.key, message
    assert err.value == bad.value, message
    assert message.startswith(f"{bad.key}="), message
    assert repr(bad.value) in message, message
    assert bad.hint in message, message
    assert err.fix and err.fix in message


def test_enough_distinct_bad_configs() -> None:
    assert len({b.id for b in BAD}) == len(BAD) >= 30
    assert len({b.key.split("[")[0] for b in BAD}) >= 20, "bad configs should cover most of the schema"


@pytest.mark.parametrize("bad", BAD, ids=[b.id for b in BAD])
def test_bad_config_is_refused(bad: Bad) -> None:
    with pytest.raises(ConfigError) as info:
        Platform(**bad.fields).validate(bad.gpus_available)
    _check(info.value, bad)


@pytest.mark.parametrize("bad", BAD, ids=[b.id for b in BAD])
def test_bad_config_is_refused_through_platform_from_config(bad: Bad) -> None:
    """The same configs as a plain mapping, as a launcher reads them from a job's config."""
    with pytest.raises(ConfigError) as info:
        platform_from_config(dict(bad.fields)).validate(bad.gpus_available)
    _check(info.value, bad)


def test_machine_check_refuses_before_anything_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    """`checks.check` is what the runtime calls first; with the GPU count mocked to 0 it refuses nccl."""
    from ddpw_runtime.launch import checks

    monkeypatch.setattr(checks, "gpus_available", lambda platform: 0)  # mocks only the GPU count
    with pytest.raises(ConfigError) as info:
        checks.check(Platform(device="gpu", n_gpus_per_node=1, backend="nccl"))
    assert info.value.key == "platform.backend"
    with pytest.raises(ConfigError) as info:
        checks.check(Platform(n_procs_per_node=2, ipc_groups=[[0], [0, 1]]))
    assert info.value.key == "platform.ipc_groups"


def test_machine_check_bad_count_on_slurm_is_a_config_error() -> None:
    """The check asks `uses_gpus` before `validate`; a bad count must still give a ConfigError."""
    from ddpw_runtime.launch import checks

    with pytest.raises(ConfigError) as info:
        checks.check(platform_from_config({"device": "slurm", "n_gpus_per_node": "two"}))
    assert info.value.key == "platform.n_gpus_per_node"
    assert "'two'" in str(info.value)


def test_machine_check_upon_finish_that_does_not_import() -> None:
    from ddpw_runtime.launch import checks

    with pytest.raises(ConfigError) as info:
        checks.check(Platform(upon_finish="no_such_module_ddpw.sub:fn"))
    assert info.value.key == "platform.upon_finish"
    assert "'no_such_module_ddpw.sub:fn'" in str(info.value)
    assert "package.module:function" in str(info.value)


# ------------------------------------------------------------------------------- platform_from_config
UNKNOWN = [
    pytest.param({"n_gpu": 1}, "platform.n_gpu", 1, id="typo-n_gpu"),
    pytest.param({"n_nodes": 1, "nodes": 2}, "platform.nodes", 2, id="nodes"),
    pytest.param({"device": "cpu", "Device": "gpu"}, "platform.Device", "gpu", id="wrong-case"),
    pytest.param({"world_size": 4}, "platform.world_size", 4, id="derived-value-is-not-a-field"),
    pytest.param({"n_proc_per_node": 4}, "platform.n_proc_per_node", 4, id="typo-did-you-mean"),
]


@pytest.mark.parametrize("node, key, value", UNKNOWN)
@pytest.mark.parametrize("as_dictconfig", [False, True], ids=["dict", "dictconfig"])
def test_unknown_key_is_refused(node: dict[str, Any], key: str, value: Any, as_dictconfig: bool) -> None:
    with pytest.raises(ConfigError) as info:
        platform_from_config(OmegaConf.create(node) if as_dictconfig else node)
    assert info.value.key == key
    message = str(info.value)
    assert repr(value) in message
    assert "Platform has no such field" in message and "n_gpus_per_node" in message
    if key == "platform.n_proc_per_node":
        assert "did you mean n_procs_per_node?" in message


def test_an_unknown_key_added_to_the_structured_node_is_refused() -> None:
    """What Hydra does with `+platform.foo=1` and `+platform.layout.expert=2`: the key is added to the
    structured node, at any level, which OmegaConf alone would accept as a stray attribute."""
    for path, key in (("foo", "platform.foo"), ("layout.expert", "platform.layout.expert")):
        node = OmegaConf.structured(Platform)
        OmegaConf.update(node, path, 1, force_add=True)  # as Hydra adds a `+` key
        with pytest.raises(ConfigError) as info:
            platform_from_config(node)
        assert info.value.key == key and info.value.value == 1


@pytest.mark.parametrize("as_dictconfig", [False, True], ids=["dict", "dictconfig"])
def test_a_preset_written_with_platform_at_its_top_is_refused_naming_the_fix(as_dictconfig: bool) -> None:
    """`conf/platform/mine.yaml` holding `platform: {n_procs_per_node: 2}`: Hydra places it under `platform`, so the
    fields land in `platform.platform`. The fix named the `_own_platform` launcher options, which do not help."""
    node = {"platform": {"n_procs_per_node": 2}}
    with pytest.raises(ConfigError) as info:
        platform_from_config(OmegaConf.create(node) if as_dictconfig else node, not_ours=". If `platform` is yours")
    assert info.value.key == "platform.platform" and info.value.value == {"n_procs_per_node": 2}
    assert "drop its `platform:` line and un-indent what it holds" in str(info.value)
    assert "If `platform` is yours" not in str(info.value)


@pytest.mark.parametrize("node", [pytest.param([1, 2], id="list"), pytest.param("cpu", id="str")])
def test_platform_that_is_not_a_mapping_is_refused(node: Any) -> None:
    with pytest.raises(ConfigError) as info:
        platform_from_config(node)
    assert info.value.key == "platform"
    assert repr(node) in str(info.value) and "mapping of Platform fields" in str(info.value)


OMEGACONF_TYPE_ERRORS = [
    pytest.param({"n_nodes": "abc"}, "n_nodes", id="n_nodes-abc"),
    pytest.param({"n_procs_per_node": "four"}, "n_procs_per_node", id="n_procs_per_node-four"),
    pytest.param({"master_port": "http"}, "master_port", id="master_port-http"),
    pytest.param({"console_logs": "maybe"}, "console_logs", id="console_logs-maybe"),
    pytest.param({"ipc_groups": 3}, "ipc_groups", id="ipc_groups-int"),
    pytest.param({"ipc_groups": [["a"]]}, "ipc_groups", id="ipc_groups-str-rank"),
]


@pytest.mark.parametrize("override, key", OMEGACONF_TYPE_ERRORS)
def test_omegaconf_type_error_when_merged_into_schema(override: dict[str, Any], key: str) -> None:
    """These come from OmegaConf, before our validation runs; they still name the key."""
    with pytest.raises(ValidationError) as info:
        OmegaConf.merge(OmegaConf.structured(Platform), override)
    assert f"full_key: {key}" in str(info.value)


def test_omegaconf_refuses_unknown_key_in_schema() -> None:
    with pytest.raises(ConfigKeyError) as info:
        OmegaConf.merge(OmegaConf.structured(Platform), {"n_gpu": 1})
    assert "n_gpu" in str(info.value)


# ------------------------------------------------------------------------------- happy paths
def test_defaults_validate() -> None:
    platform = Platform()
    assert platform.validate() is platform
    assert platform.validate(gpus_available=0) is platform
    assert platform_from_config(None) == Platform()


GOOD = [
    pytest.param({}, None, id="defaults"),
    pytest.param({"n_procs_per_node": 4, "n_cpus_per_node": 8, "ipc_groups": [[0, 2], [1, 3]]}, None,
                 id="cpu-groups"),
    pytest.param({"device": "GPU", "n_gpus_per_node": 2, "backend": "nccl"}, 2, id="gpu-nccl"),
    pytest.param({"device": "cuda", "n_gpus_per_node": 1}, None, id="cuda-gpu-count-unknown"),
    pytest.param(_slurm(n_nodes=4, n_gpus_per_node=8, partition="a100", master_port=29500,
                        slurm_additional_parameters={"qos": "high", "gres": "gpu:8", "exclusive": True}),
                 None, id="slurm-multi-node"),
    pytest.param({"device": "slurm", "n_nodes": 2, "n_cpus_per_node": 4}, None, id="slurm-cpu"),
    pytest.param({"device": "mps", "console_ranks": "all", "upon_finish": "pkg.mod:fn"}, None, id="mps"),
    pytest.param({"n_procs_per_node": 2, "master_addr": "10.0.0.1", "ipc_protocol": "file",
                  "spawn_method": "spawn", "seed": 0, "console_ranks": [1]}, None, id="file-spawn"),
    pytest.param({"n_procs_per_node": MAX_WORLD_SIZE, "seed": 2**32 - 1}, None, id="largest-world"),
    pytest.param({"n_procs_per_node": 2, "master_addr": "::1"}, None, id="ipv6-master_addr"),  # (it was refused)
]


@pytest.mark.parametrize("fields, gpus", GOOD)
def test_good_configs_validate(fields: dict[str, Any], gpus: int | None) -> None:
    Platform(**fields).validate(gpus)
    platform_from_config(dict(fields)).validate(gpus)


@pytest.mark.parametrize(
    "fields, ranks_per_node, world_size",
    [
        pytest.param({}, 1, 1, id="cpu-default-1"),
        pytest.param({"n_procs_per_node": 3}, 3, 3, id="cpu-procs"),
        pytest.param({"device": "gpu", "n_gpus_per_node": 4}, 4, 4, id="gpu-default-one-per-gpu"),
        pytest.param({"device": "gpu", "n_gpus_per_node": 4, "n_procs_per_node": 2}, 2, 2, id="gpu-procs"),
        pytest.param(_slurm(n_nodes=3, n_gpus_per_node=2), 2, 6, id="slurm-gpus"),
        pytest.param({"device": "slurm", "n_nodes": 3}, 1, 3, id="slurm-cpu"),
        pytest.param({"device": "mps"}, 1, 1, id="mps"),
    ],
)
def test_derived_sizes(fields: dict[str, Any], ranks_per_node: int, world_size: int) -> None:
    platform = Platform(**fields)
    assert platform.ranks_per_node == ranks_per_node
    assert platform.world_size == world_size
    assert platform.requires_ipc is (world_size > 1)


@pytest.mark.parametrize(
    "fields, backend",
    [
        pytest.param({}, "gloo", id="cpu"),
        pytest.param({"device": "mps"}, "gloo", id="mps"),
        pytest.param({"device": "gpu", "n_gpus_per_node": 1}, "nccl", id="gpu"),
        pytest.param({"device": "slurm", "n_gpus_per_node": 1}, "nccl", id="slurm-gpu"),
        pytest.param({"device": "slurm", "n_gpus_per_node": 0}, "gloo", id="slurm-cpu"),
        pytest.param({"device": "gpu", "n_gpus_per_node": 1, "backend": "gloo"}, "gloo", id="explicit"),
    ],
)
def test_resolved_backend(fields: dict[str, Any], backend: str) -> None:
    assert Platform(**fields).resolved_backend == backend


@pytest.mark.parametrize(
    "text, device",
    [("cpu", Device.CPU), ("CPU", Device.CPU), (" Gpu ", Device.GPU), ("cuda", Device.GPU),
     ("CUDA", Device.GPU), ("mps", Device.MPS), ("Slurm", Device.SLURM), (Device.MPS, Device.MPS)],
)
def test_device_from_str(text: Any, device: Device) -> None:
    assert Device.from_str(text) is device


def test_device_from_str_bad_value() -> None:
    with pytest.raises(ConfigError) as info:
        Device.from_str("tpu")
    assert info.value.key == "platform.device"
    assert "'tpu'" in str(info.value) and "cpu, gpu, mps, slurm" in str(info.value)


@pytest.mark.parametrize("given, device", [("CPU", "cpu"), (" Gpu ", "gpu"), ("CUDA", "gpu"), (Device.MPS, "mps")])
def test_a_device_named_in_another_case_is_kept_as_its_own_name(given: Any, device: str) -> None:
    """`platform.device=CPU` was accepted (`Device.from_str` reads any case) and shown as typed: `device : CPU` in the
    dry run's platform, `ddpw_runtime.platform().device == "cpu"` false in a rank. It is kept as the device's name."""
    for platform in (Platform(device=given), platform_from_config(OmegaConf.create({"device": given}))):
        assert platform.device == device and f"device                      : {device}\n" in platform.summary()
    assert Platform(device="tpu").device == "tpu"  # (no device: `validate` refuses it as given)


@pytest.mark.parametrize("text, key, value", [
    ("n_procs_per_node: ${nope}", "platform.n_procs_per_node", "${nope}"),
    ("layout:\n  tensor: ${oc.env:DDPW_TEST_NOT_SET}", "platform.layout.tensor", "${oc.env:DDPW_TEST_NOT_SET}"),
    ("ipc_groups: [[0, '${nope}']]", "platform.ipc_groups[0][1]", "${nope}"),
    ("seed: ???", "platform.seed", "???"),
])
def test_a_whole_config_whose_value_cannot_be_resolved_names_it_as_a_platform_key(text: str, key: str,
                                                                                   value: str) -> None:
    """`platform_from_config` on a config that is the platform itself (its fields at its top) named such a key without
    `platform.` (`n_procs_per_node='${nope}': ...`), unlike every other error of that config; a node inside a config
    is named by its key there."""
    with pytest.raises(ConfigError) as info:
        platform_from_config(OmegaConf.create(text))
    assert (info.value.key, info.value.value) == (key, value)
    assert str(info.value).startswith(f"{key}={value!r}: ")
    nested = OmegaConf.create({"train": {"platform": OmegaConf.create(text)}})
    with pytest.raises(ConfigError) as info:
        platform_from_config(nested.train.platform)
    assert (info.value.key, info.value.value) == ("train." + key, value)


def test_summary_names_every_field() -> None:
    from dataclasses import fields

    summary = Platform(n_procs_per_node=2).summary()
    for f in fields(Platform):
        assert f.name in summary
    assert "world_size" in summary and "gloo" in summary


def test_platform_from_structured_dictconfig() -> None:
    node = OmegaConf.structured(Platform)
    node.n_procs_per_node = 2
    node.ipc_groups = [[0], [1]]
    node.console_ranks = [0, 1]
    platform = platform_from_config(node)
    assert isinstance(platform, Platform)
    assert platform.world_size == 2
    assert platform.ipc_groups == [[0], [1]] and isinstance(platform.ipc_groups[0], list)
    assert platform.validate() is platform


def test_platform_from_plain_dict_and_dictconfig() -> None:
    fields: dict[str, Any] = {"device": "cpu", "n_procs_per_node": 2, "console_ranks": "all"}
    for node in (fields, OmegaConf.create(fields)):
        platform = platform_from_config(node)
        assert platform == Platform(**fields)
        assert platform.validate().shown_ranks() == [0, 1]


def test_structured_dictconfig_with_bad_value_still_fails_validation() -> None:
    """OmegaConf accepts any int and any str; the range and choice checks are ours."""
    node = OmegaConf.merge(OmegaConf.structured(Platform), {"n_nodes": 0, "device": "cpu"})
    assert isinstance(node, DictConfig)
    with pytest.raises(ConfigError) as info:
        platform_from_config(node).validate()
    assert info.value.key == "platform.n_nodes"


# ------------------------------------------------------------------------------- the real Hydra path
HYDRA_BAD = [
    pytest.param("platform.n_procs_per_node=0", "platform.n_procs_per_node=0", id="n_procs_per_node-0"),
    pytest.param("platform.backend=nccl", "platform.backend='nccl'", id="nccl-on-cpu"),
    pytest.param("platform.ipc_groups=[[0],[0,1]]", "platform.ipc_groups=[[0], [0, 1]]", id="overlapping-groups"),
    pytest.param("platform.device=tpu", "platform.device='tpu'", id="device-tpu"),
    pytest.param("platform.name=my job", "platform.name='my job'", id="name-with-space"),
]


def _run_train(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "WORLD_SIZE", "MASTER_", "LOCAL_"))}
    return subprocess.run(
        [sys.executable, str(TRAIN), *overrides],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _plain_run_check(override: str) -> None:
    """What a plain run of examples/train.py checks before anything starts (the launcher's callback at
    Hydra's `on_run_start`), on the config Hydra composes for `override`."""
    from hydra import compose, initialize_config_dir

    from ddpw_conf.launcher import selected_options
    from ddpw_runtime.hydra_jobs.prepare import hydra_config_of
    from ddpw_runtime.procs.plain_run import checked_platform

    with initialize_config_dir(config_dir=str(TRAIN.parent / "conf"), version_base=None):
        cfg = compose(config_name="config", overrides=[override], return_hydra_config=True)
        options = selected_options(cfg.hydra.launcher)
        assert options is not None
        with hydra_config_of(cfg):
            checked_platform(cfg, options)


@pytest.mark.parametrize("override, shown", HYDRA_BAD)
def test_bad_override_is_refused_before_anything_starts(
    override: str, shown: str, hydra_restore_singletons: Any
) -> None:
    with pytest.raises(ConfigError) as info:
        _plain_run_check(override)
    assert shown in str(info.value)


@pytest.mark.subprocess
def test_bad_override_ends_the_program_with_one_clear_line_and_no_rank(tmp_path: Path) -> None:
    proc = _run_train(tmp_path, "platform.n_procs_per_node=0")
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1, output
    assert "platform.n_procs_per_node=0: use an integer >= 1" in output, output
    assert "Traceback" not in output, output  # one clear line, not a stack trace
    assert not list(tmp_path.rglob("rank_*.log")), "a rank started for a config that cannot run"


@pytest.mark.subprocess
def test_good_override_through_hydra_does_start_ranks(tmp_path: Path) -> None:
    """Control for the test above: the same program with a good config writes rank_0.log, so the
    'no rank_0.log' assertion there means something."""
    pytest.importorskip("sklearn")
    proc = _run_train(tmp_path, "platform.n_procs_per_node=1", "epochs=1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert list(tmp_path.rglob("rank_0.log"))


@pytest.mark.parametrize(
    "options, key",
    [
        ({"stop_grace_s": -5}, "hydra.launcher.stop_grace_s"),
        ({"interrupt_grace_s": "soon"}, "hydra.launcher.interrupt_grace_s"),
        ({"dry_run": "yes"}, "hydra.launcher.dry_run"),
        ({"max_restarts": -1}, "hydra.launcher.max_restarts"),
        ({"max_parallel_jobs": 0}, "hydra.launcher.max_parallel_jobs"),
    ],
)
def test_local_launcher_options_are_checked_as_the_slurm_ones(options: dict[str, Any], key: str) -> None:
    from ddpw_conf.launcher import LocalLauncherConf, SlurmLauncherConf

    with pytest.raises(ConfigError) as info:
        LocalLauncherConf(**options).validate()
    assert info.value.key == key
    if key != "hydra.launcher.max_parallel_jobs":  # the one option SLURM does not have
        with pytest.raises(ConfigError):
            SlurmLauncherConf(**options).validate()


def test_an_unknown_launcher_option_is_refused_naming_the_known_ones() -> None:
    from ddpw_conf.launcher import LocalLauncherConf

    with pytest.raises(ConfigError) as info:
        LocalLauncherConf.from_mapping({"stop_grace": 2})
    assert info.value.key == "hydra.launcher.stop_grace" and "stop_grace_s" in str(info.value)
