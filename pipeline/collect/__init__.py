"""The agent pool and its calls: agents, client, collection, pre-flight, call log, replay, grading, rewards."""
