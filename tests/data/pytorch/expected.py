#!/usr/bin/env python3
"""Expected figures for the PyTorch snapshots in this folder, computed with
Python's own pickle module, independently of tidepool's restricted reader.

Run once by hand: `python3 expected.py`. Its output is pasted into
tests/trace/pytorch_snapshot_test.cpp. The pickles are our own test data
(trusted); never pickle.load a snapshot you did not make or check.

The figures follow tidepool's reading of a snapshot (include/tidepool/trace_io.hpp):
  - one device: the only one with trace entries;
  - 'alloc' starts a lifetime of 'size' bytes, 'free_completed' ends it;
    'free_requested' and 'snapshot' change nothing; 'oom' counts as a failed alloc;
  - a free_completed whose alloc is not in the trace is an unmatched free: its block
    was live at the start and is seeded (an alloc before the first entry), as is every
    'active_allocated' block of 'segments' whose address no alloc or free names;
  - segment_alloc/segment_map add to the reserved bytes, segment_free/segment_unmap
    take from them; the bytes reserved before the first entry are the bytes of the
    'segments' at dump time minus the net change of the window, and count as one
    more segment event when positive.
"""
import pickle
import sys

FILES = ["cs336-magma27.pickle", "cs336-bcrafton.pickle"]


def figures(path):
    with open(path, "rb") as f:
        snapshot = pickle.load(f)
    traces = snapshot["device_traces"]
    devices = [d for d, entries in enumerate(traces) if entries]
    assert len(devices) == 1, devices
    device = devices[0]
    # Seeding: blocks live when recording began.
    seen = set()
    seeded = []
    touched = set()
    for entry in traces[device]:
        if entry["action"] == "alloc":
            seen.add(entry["addr"])
            touched.add(entry["addr"])
        elif entry["action"] == "free_completed":
            if entry["addr"] not in seen:
                seeded.append(entry["size"])
            seen.discard(entry["addr"])
            touched.add(entry["addr"])
    for segment in snapshot["segments"]:
        if segment.get("device", device) != device:
            continue
        for block in segment.get("blocks", []):
            if block["state"] == "active_allocated" and block["address"] not in touched:
                seeded.append(block.get("requested_size", block["size"]))
    live = {}  # addr -> bytes
    live_bytes = peak_live = sum(seeded)
    allocs = len(seeded)
    frees = unmatched = ooms = segment_events = 0
    reserved_delta = 0
    reserved_path = [0]  # reserved bytes after each segment event, relative to the start
    for entry in traces[device]:
        action = entry["action"]
        if action == "alloc":
            assert entry["addr"] not in live
            live[entry["addr"]] = entry["size"]
            live_bytes += entry["size"]
            peak_live = max(peak_live, live_bytes)
            allocs += 1
        elif action == "free_completed":
            if entry["addr"] in live:
                live_bytes -= live.pop(entry["addr"])
            else:
                live_bytes -= entry["size"]
                unmatched += 1
            frees += 1
        elif action in ("segment_alloc", "segment_map"):
            reserved_delta += entry["size"]
            reserved_path.append(reserved_delta)
            segment_events += 1
        elif action in ("segment_free", "segment_unmap"):
            reserved_delta -= entry["size"]
            reserved_path.append(reserved_delta)
            segment_events += 1
        elif action == "oom":
            ooms += 1
    reserved_at_dump = sum(s["total_size"] for s in snapshot["segments"]
                           if s.get("device", device) == device)
    before = reserved_at_dump - reserved_delta
    if before > 0:
        segment_events += 1
    else:
        before = 0
    peak_reserved = before + max(reserved_path)
    return {
        "device": device,
        "entries": len(traces[device]),
        "events": allocs + frees + segment_events,
        "blocks": allocs,
        "frees": frees,
        "unmatched_frees": unmatched,
        "failed_allocs": ooms,
        "segment_events": segment_events,
        "seeded_blocks": len(seeded),
        "seeded_bytes": sum(seeded),
        "total_alloc_bytes": sum(seeded) + sum(e["size"] for e in traces[device] if e["action"] == "alloc"),
        "peak_live_bytes": peak_live,
        "live_blocks_at_end": len(live) + len(seeded) - unmatched,
        "live_bytes_at_end": live_bytes,
        "reserved_before_bytes": before,
        "peak_segment_bytes": peak_reserved,
        "segment_bytes_at_end": reserved_at_dump if before > 0 else reserved_delta,
    }


if __name__ == "__main__":
    folder = sys.argv[1] if len(sys.argv) > 1 else "."
    for name in FILES:
        print(name)
        for key, value in figures(f"{folder}/{name}").items():
            print(f"  {key} = {value}")
