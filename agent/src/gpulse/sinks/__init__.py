"""Where lines go: InfluxDB 3, v2, v1, a recording file."""
