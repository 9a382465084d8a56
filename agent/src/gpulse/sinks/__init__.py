"""Where lines go: InfluxDB v2, InfluxDB v1, a recording file."""
