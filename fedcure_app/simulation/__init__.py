"""The SAFL simulation: event-driven engine on a simulated clock and its client executors."""
