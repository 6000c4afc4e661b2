"""Client keys: who is calling (`ring`), what their limits allow (`limits`), and what they
used (`metrics`). State is in memory, per gateway process."""
