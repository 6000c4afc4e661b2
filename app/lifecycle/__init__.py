"""One backend's life: its states and their transitions, start, stop, sleep and wake, the
lease and queue of its requests, what it serves, and what it saves of itself. The hosts'
GPU memory is `app.vram`'s; the loops over every backend are `app.control`'s."""
