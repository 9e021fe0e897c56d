"""The search: what each iteration proposes and trains (rules, factory, iteration, frozen
members, optimizers, the step budget) and how the best ensemble is chosen and recorded."""
