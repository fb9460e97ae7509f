"""Energy and emissions estimates: the arithmetic from the published figures, and clear errors for what the tables
lack."""

import pytest

from trainer.contract.catalog import EFA_INSTANCE_TYPES, INSTANCE_TYPES
from trainer.cost.energy import (
    GPU_POWER_W,
    GRID_KG_CO2E_PER_KWH,
    NODE_POWER,
    PUE,
    emissions_kg,
    energy_kwh,
    node_kilowatts,
)


def test_a_p5_node_hour_is_the_dgx_h100_maximum_times_the_pue():
    assert energy_kwh("p5.48xlarge", 1) == pytest.approx(10.2 * 1.135)
    assert energy_kwh("p5.48xlarge", 100) == pytest.approx(100 * energy_kwh("p5.48xlarge", 1))


def test_a_node_draws_at_least_what_its_eight_gpus_do():
    for name in EFA_INSTANCE_TYPES:
        kind = INSTANCE_TYPES[name]
        assert node_kilowatts(name) > kind.gpus * GPU_POWER_W[kind.gpu_model] / 1000, name


def test_every_efa_type_has_a_published_node_figure_and_others_fall_back_to_their_gpus():
    assert set(NODE_POWER) == set(EFA_INSTANCE_TYPES)
    assert node_kilowatts("g5.xlarge") == pytest.approx(0.150)


def test_emissions_are_energy_times_the_regions_grid_intensity():
    kwh = energy_kwh("p5.48xlarge", 24 * 4)  # four nodes for a day
    assert emissions_kg(kwh, "us-east-1") == pytest.approx(24 * 4 * 10.2 * PUE * 0.379069)
    assert emissions_kg(kwh, "eu-north-1") < emissions_kg(kwh, "us-west-2") < emissions_kg(kwh, "us-east-1")


def test_an_unknown_region_names_the_table_and_its_regions():
    with pytest.raises(KeyError, match=r"no grid intensity for Region 'mars-1'.*us-east-1"):
        emissions_kg(1.0, "mars-1")


def test_negative_hours_are_refused():
    with pytest.raises(ValueError, match="hours -1"):
        energy_kwh("p5.48xlarge", -1)


def test_the_intensity_table_is_in_kilograms_per_kwh():
    assert all(0 < value < 1.2 for value in GRID_KG_CO2E_PER_KWH.values())
