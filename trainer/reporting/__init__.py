"""What a job tells people: report.json and its table, the leaderboard, progress lines,
console output and Vertex AI Experiments."""
