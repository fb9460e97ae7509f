"""What a run costs, in dollars and in energy: prices from AWS (or a dated snapshot) and estimates of power and
emissions. Imports no torch, so the planner and the ledger read it anywhere.

    pricing     hourly_price(instance_type, region, option): On-Demand, Spot, Capacity Block, reservation;
                the checked-in snapshot (prices.json) and AWS's per-GB data-transfer rates
    energy      energy_kwh(instance_type, hours) and emissions_kg(kwh, region): estimates from published figures
    idle        what an idle stack pays on GPUs, and the most a job's node start-up costs (EKS)
    resilience  what interruptions cost: the checkpoint interval by Young's rule from a published interruption rate,
                the expected goodput and lost work (the planner recommends it, the ledger compares against it)
    ledger      a run's Ledger (paid time by category, node-hours, dollars, goodput), its resume and the cap
"""
