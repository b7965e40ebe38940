"""The agent pool and its calls: agents, client, collection, pre-flight, call log, replay, stand-in, bounded grading,
answers, rewards, regrade; the collection's quality rules, budget, forecast and new agents on a sample."""
