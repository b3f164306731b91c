"""HTTP for the broker, loaded only when the management listener is on (``[http] port``): ``server`` (a small
HTTP/1.1 server on trio over h11), ``api`` (the JSON management API and its routes), ``auth`` (Basic
credentials and the ``manage`` permission), ``metrics`` (the Prometheus exposition) and ``console`` (the web
console page). Nothing is imported here, so a broker without the listener never loads h11."""
