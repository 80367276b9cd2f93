"""Coordinator: plan, round state machine, strategies, gRPC service and simulation driver."""
