"""The router's HTTP surface: request bodies, answers, and the search endpoint both entry points share."""
