def main(argv=None):
    print("tramontane-cli")
