"""Planning a deployment before renting it: a discrete-event model of the live loop (browsers, policy server,
admission gate, trainer), calibrated on the JSON the benches print and validated against the measured
async/sync runs (docs/fleet_model.md). Pure Python and numpy: no JAX, no browser."""
