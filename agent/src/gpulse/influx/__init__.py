"""Everything that talks to InfluxDB besides writes: connection settings, InfluxQL, setup, downsampling."""
