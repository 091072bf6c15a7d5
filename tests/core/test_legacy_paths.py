"""Import paths from before the one-folder-per-backend layout still work (user code and
the core-review reproductions import them)."""

from tailrace import interfaces


def test_systems_base_and_checkpoint_base_are_the_interfaces() -> None:
    from tailrace.checkpoint.base import CheckpointStore
    from tailrace.systems.base import PartitionReader, Producer, System

    assert (PartitionReader, Producer, System, CheckpointStore) == (
        interfaces.PartitionReader,
        interfaces.Producer,
        interfaces.System,
        interfaces.CheckpointStore,
    )
