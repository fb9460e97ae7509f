"""How NCCL 2.28 reads NCCL_NET_PLUGIN (NVIDIA/nccl v2.28.9-1 src/plugin/net.cc, ncclNetPluginInit), its plugin name
rule (src/plugin/plugin_open.cc, openPluginLib) and the loader's search order. The NCCL lines the model follows are
copied from the tag into tests/preflight/fixtures/nccl_net_plugin_lines.json."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT
from trainer.preflight.netplugin import (
    DEFAULT_PLUGIN,
    PLUGIN_PREFIX,
    environment_problem,
    plugin_library_names,
    plugin_names,
    resolve,
    search_dirs,
)

NCCL = json.loads((Path(__file__).parent / "fixtures" / "nccl_net_plugin_lines.json").read_text())
LINES = {line["text"] for line in NCCL["lines"]}


def test_the_model_follows_nccl_2_28s_source():
    assert NCCL["source"] == "github.com/NVIDIA/nccl tag v2.28.9-1"
    assert f'const char* defaultNetPlugin = "{DEFAULT_PLUGIN}";' in LINES
    assert any(f'"{PLUGIN_PREFIX}"' in text for text in LINES)
    # Set: the value is a ","-separated list, "none" is an empty one; unset: the default plugin.
    assert 'if (strcasecmp(envNetPlugin, "none") == 0)' in LINES and 'envNetPlugin = "";' in LINES
    assert 'netPluginName = strtok_r(envNetPluginList, ",", &savePtr);' in LINES
    assert "// Add default net plugin" in LINES


@pytest.mark.parametrize("value", ["", "none", "NONE", ","])
def test_set_but_empty_or_none_loads_no_external_plugin(value):
    # strtok_r over "" (or only separators) yields no name: NCCL falls back to its internal IB/socket transports.
    assert plugin_names(value) == [] and plugin_library_names(value) == []
    assert resolve(value, ["/lib"]) is None


def test_names_follow_nccls_open_plugin_lib():
    assert plugin_names(None) == ["libnccl-net.so"]
    assert plugin_library_names(None) == ["libnccl-net.so"]
    assert plugin_library_names("ofi") == ["ofi", "libnccl-net-ofi.so"]
    assert plugin_names("ofi,spcx") == ["ofi", "spcx"]
    assert re.search(r"%s-%s\.so", " ".join(LINES))
    # A path or a full "lib*.so" name is opened as given, with no libnccl-net-<name>.so retry.
    assert plugin_library_names("/opt/x/libnccl-net-ofi.so") == ["/opt/x/libnccl-net-ofi.so"]
    assert plugin_library_names("libnccl-net-ofi.so") == ["libnccl-net-ofi.so"]


def test_loader_order_is_ld_library_path_then_cache_then_defaults(tmp_path):
    for directory in ("first", "second"):
        (tmp_path / directory).mkdir()
        (tmp_path / directory / "libnccl-net-ofi.so").touch()
    dirs = search_dirs("/first:/missing", ["/second", "/first"])
    assert dirs == ["/first", "/missing", "/second", "/lib", "/usr/lib"]
    assert resolve("ofi", dirs, root=tmp_path) == tmp_path / "first" / "libnccl-net-ofi.so"
    assert (
        resolve("ofi", search_dirs(None, ["/second"]), root=tmp_path)
        == tmp_path / "second" / "libnccl-net-ofi.so"
    )


def test_the_build_check_fails_where_the_plugin_is_absent():
    """This machine has no EFA installer: the image-build check must refuse, naming what it looked for."""
    result = subprocess.run(
        [sys.executable, "-m", "trainer.preflight.netplugin"],
        cwd=ROOT,
        env={
            **{k: v for k, v in os.environ.items() if k != "NCCL_NET_PLUGIN"},
            "LD_LIBRARY_PATH": "/nonexistent",
        },
        capture_output=True,
        text=True,
    )
    assert result.returncode == 1
    assert (
        "NCCL_NET_PLUGIN=ofi (image/efa.env): none of ofi, libnccl-net-ofi.so is in /nonexistent:"
        in result.stderr
    )


def test_the_images_environment_must_name_efa_envs_plugin():
    assert environment_problem("ofi", {}) is None  # unset: entrypoint.sh or the job definition sets it
    assert environment_problem("ofi", {"NCCL_NET_PLUGIN": "ofi"}) is None
    assert "loads no network plugin" in environment_problem("ofi", {"NCCL_NET_PLUGIN": ""})
    assert "image/efa.env says 'ofi'" in environment_problem("ofi", {"NCCL_NET_PLUGIN": "spcx"})


def test_the_build_check_refuses_an_empty_value_in_the_images_environment():
    """`docker run --entrypoint python` sees the image's ENV only: an empty value there would run on sockets."""
    result = subprocess.run(
        [sys.executable, "-m", "trainer.preflight.netplugin"],
        cwd=ROOT,
        env={**os.environ, "NCCL_NET_PLUGIN": ""},
        capture_output=True,
        text=True,
    )
    assert result.returncode == 1
    assert (
        "NCCL_NET_PLUGIN is set to '' in this environment: NCCL 2.28 then loads no network plugin"
        in result.stderr
    )
