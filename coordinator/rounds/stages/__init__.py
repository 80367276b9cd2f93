"""The stages the round machine (coordinator/rounds/machine.py) sequences, one module per
sub-protocol.

Each module holds the typed state of its sub-protocol and the handlers of the silos' messages
for it, pure: no I/O, time passed in. A handler returns the events it caused and says where its
sub-protocol goes next; the machine alone moves the federation from stage to stage, opens,
aborts and completes rounds.

- ``base``: what every stage shares (Stage, Event, RoundRecord, the machine's Position).
- ``group_key``: the silo group key, relayed blind (SETUP_ADVERTISE -> SETUP_SEAL -> SETUP_OPEN).
- ``secure_aggregation``: one attempt of secure aggregation with dropout recovery (Bonawitz et
  al. 2017): ADVERTISE -> SHARE -> INPUT -> CONSISTENCY -> UNMASK -> the decoded aggregate.
- ``similarity``: GCFL's split under CKKS (SIMILARITY -> DECRYPT).
- ``training``: a round of an algorithm that aggregates nothing (TRAIN: silos train and report).
- ``metric_sums``: federation-wide figures from evaluation counts summed inside the masked
  vectors ([metrics] aggregate = true).
- ``sequencer``: the machine's state and its moves from stage to stage (open, abort, complete a
  round); ``coordinator/rounds/machine.py`` adds the inputs and queries callers use
  (``RoundMachine``).
"""
