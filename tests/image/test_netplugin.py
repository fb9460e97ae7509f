"""NCCL's plugin name rule (NVIDIA/nccl src/plugin/plugin_open.cc, openPluginLib) and the loader's search order."""

import os
import subprocess
import sys
from pathlib import Path

from trainer.preflight.netplugin import plugin_library_names, resolve, search_dirs

ROOT = Path(__file__).resolve().parents[2]


def test_names_follow_nccls_open_plugin_lib():
    assert plugin_library_names(None) == ["libnccl-net.so"]
    assert plugin_library_names("") == ["libnccl-net.so"]
    assert plugin_library_names("ofi") == ["ofi", "libnccl-net-ofi.so"]
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
        env={**os.environ, "LD_LIBRARY_PATH": "/nonexistent"},
        capture_output=True,
        text=True,
    )
    assert result.returncode == 1
    assert (
        "NCCL_NET_PLUGIN=ofi (image/efa.env): none of ofi, libnccl-net-ofi.so is in /nonexistent:"
        in result.stderr
    )
