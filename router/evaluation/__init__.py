"""Learning from traffic: shadow comparisons (`shadow.py`) and the judges that turn a pair of
answers into labels (`judges/`). Everything here runs off the request path."""
