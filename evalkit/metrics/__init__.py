"""Pure metric functions: scores from records, never from models."""
