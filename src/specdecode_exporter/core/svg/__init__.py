"""Small inline SVG charts, drawn by the status page and by `probe --plot`."""
