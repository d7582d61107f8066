"""Moving objects between nodes and to TCP drivers."""
