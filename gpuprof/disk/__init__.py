"""bench-disk's library: filesystem facts (fs), the test file (target), read measurements
(bench), the whole run (suite) and the training loop's demand (requirement)."""
