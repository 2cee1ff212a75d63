"""The optimizer passes, one module each; their order is `optimizer.PASSES`."""
