"""Who may call what: client and admin keys (`auth`), and the browser origins and `Host`
names a request may come with (`origins`, pure)."""
