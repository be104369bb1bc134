"""What runs inside a rank: its entry point, its set-up, its environment, and the helpers a task calls."""
