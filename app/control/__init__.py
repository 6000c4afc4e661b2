"""The control plane's loops over everything the gateway runs: bring-up, the health,
reaper, scrape and GPU-poll loops, and the schedules that act at their windows' edges."""
