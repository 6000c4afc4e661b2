"""What the gateway keeps across restarts: the state sections (zones, the yield, the
profile, process records...), the usage ledger (which also holds the daily cloud budgets'
spend) and the activity entries. One interface (`app.store.base.Store`), one
implementation today (`app.store.sqlite.SqliteStore`, a file in the state directory); the
async side (a dedicated thread, batched writes) is `app.store.writer.StoreWriter`."""
