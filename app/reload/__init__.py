"""Reloading the configuration while the gateway runs (`POST /config/reload`, SIGHUP,
`microscheduler reload`, `serve --watch-config`): `plan` (what changed; pure), `apply`
(doing it on the running services) and `watch` (the config directory's files)."""
