"""What a run costs, in dollars and in energy: prices from AWS (or a dated snapshot) and estimates of power and
emissions. Imports no torch, so the planner and the ledger read it anywhere.

    pricing     hourly_price(instance_type, region, option): On-Demand, Spot, Capacity Block, reservation
    ledger      a run's Ledger (paid time by category, node-hours, dollars, goodput), its resume and the cap
"""
