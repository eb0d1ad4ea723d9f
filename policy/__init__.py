"""The hidden-gpu CrossGuard policy pack: `pulumi preview --policy-pack policy`."""
