"""Notifications of what happened to the `notify:` targets (`app.notify.notifier`)."""
