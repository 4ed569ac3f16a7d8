"""Where the training data lives: filesystem kind, page-cache residency before and after the
run, and whether the file fits in RAM. Cheap facts (a mount-table scan and one mincore)."""

from __future__ import annotations

import os


class StorageFacts:
    """Instrument: facts about the data file; residency read at start and at stop."""

    name = "storage"

    def __init__(self, data_path: str | None):
        self.data_path = data_path
        self._start = None

    def _residency(self):
        from gpuprof.disk.fs import residency

        try:
            r = residency(self.data_path)
        except OSError as exc:
            return {"known": False, "reason": exc.strerror}
        return {"known": r.known, "fraction": r.fraction, "resident_bytes": r.resident_bytes,
                "reason": r.reason}

    def start(self, ctx) -> None:
        if self.data_path is None:
            self.data_path = getattr(ctx, "data_path", None)
        if self.data_path and os.path.isfile(self.data_path):
            self._start = self._residency()

    def stop(self, ctx) -> dict | None:
        if not self.data_path or not os.path.isfile(self.data_path):
            return None
        from gpuprof.disk.fs import filesystem_info, ram_bytes

        fs = filesystem_info(self.data_path).to_dict()
        total, available = ram_bytes()
        size = os.path.getsize(self.data_path)
        return {"data_path": self.data_path, "file_bytes": size, "filesystem": fs,
                "ram_total_bytes": total, "ram_available_bytes": available,
                "fits_in_ram": size <= available,
                "residency_start": self._start, "residency_end": self._residency()}
