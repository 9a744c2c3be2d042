"""The dashboard page's static files (HTML, JavaScript, CSS), served by monitoring/server.py."""
