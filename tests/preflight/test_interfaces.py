"""NCCL_SOCKET_IFNAME in image/efa.env against the interfaces of a real ECS awsvpc container (the `ip address`
listing recorded in docker-library/cassandra#223: ecs-eth0 169.254.172.8/22 is listed before eth0)."""

from trainer.contract.catalog import instance_type
from trainer.contract.image import efa_environment
from trainer.preflight.checks import FAILED, OK, SKIPPED, check_bootstrap_interface
from trainer.preflight.interfaces import bootstrap_interface, matches

AWSVPC_TASK = [("lo", "127.0.0.1"), ("ecs-eth0", "169.254.172.8"), ("eth0", "10.0.0.212")]
P5 = instance_type("p5.48xlarge")


def test_rules_follow_nccls_match_if_list():
    assert matches("^docker,lo", "eth0") and not matches("^docker,lo", "docker0")
    assert matches("eth", "eth0") and not matches("eth", "ens5")  # prefixes
    assert matches("=eth0", "eth0") and not matches("=eth", "eth0")  # exact
    assert not matches("^=eth0", "eth0") and matches("^=eth0", "eth01")


def test_the_images_setting_skips_the_awsvpc_link_local_interface():
    setting = efa_environment()["NCCL_SOCKET_IFNAME"]
    assert bootstrap_interface(setting, AWSVPC_TASK) == ("eth0", "10.0.0.212")
    assert check_bootstrap_interface(P5, setting, AWSVPC_TASK).status == OK
    # The setting before issue 13 (no ecs exclusion) would bootstrap over ecs-eth0.
    old = check_bootstrap_interface(P5, "^docker,lo,veth", AWSVPC_TASK)
    assert old.status == FAILED and "picks ecs-eth0 169.254.172.8" in old.detail
    assert check_bootstrap_interface(instance_type("g5.xlarge"), setting, AWSVPC_TASK).status == SKIPPED
