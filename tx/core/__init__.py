"""The domain, free of HTTP and of torch: the use cases the routes call, by noun.

- `sessions.py`: sessions (create, heartbeat, finish, reads, trace);
- `runs.py`: training runs (create, from a checkpoint, unload); `views.py`: the read views of runs;
- `training.py`: a run's sequenced training calls; `sequencing.py`: the rules every sequenced call follows;
- `checkpoints/`: paths and files, saves, the catalog, download links;
- `sampling/`: samplers, samples through the engine manager, text for the OpenAI-compatible routes;
- `custom_losses.py`, `base_models.py`;
- many keys on one server: `quotas.py` (what each key may hold, the error past it), `fairshare.py` (whose
  ready work goes next, by tokens per key);
- the machinery under them: `futures.py` (futures and long polls), `scheduler.py` (the training thread, in
  seq_id order, turns by fair share), `completions.py`, `timeline.py`, `results.py`.

`services.py` wires the training side together; `tx/api/app.py` adds the engines and sampling.
"""
