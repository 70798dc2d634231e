"""The production pipeline: a request becomes a batch, each video runs the steps of `steps.STEPS` through
`runner`, guarded by its state (`states`) and its step leases (`leases`); what a final state updates
(`outcomes`), cancel / pause / continue (`control`) and the read-only questions people ask (`queries`)."""
